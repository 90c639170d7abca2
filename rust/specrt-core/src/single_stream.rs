//! [`SingleStream`]: the single-stream [`Engine`] as a [`RequestEngine`], so a single-stream generation runs through
//! the same driver as a batched one. One request runs at a time (its prefill in the round it starts); the others
//! wait in submission order. What the engine keeps between generations (the prefix its caches hold, for the next
//! prompt to reuse) is kept here too.

use std::collections::VecDeque;

use crate::constraint::Constraint;
use crate::engine::Engine;
use crate::error::{Result, SpecError};
use crate::request::{
    check_prompt, GenerationConfig, GenerationOutput, PromptLogprobs, StepOutput,
};
use crate::request_engine::{RequestEngine, RowStep};
use crate::stats::Stats;

/// A request waiting for its turn.
struct Waiting {
    id: u64,
    prompt: Vec<u32>,
    cfg: GenerationConfig,
    constraint: Option<Box<dyn Constraint>>,
}

/// Where the engine's current (or last) request stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Current {
    /// No request, or the last one was taken, cancelled or failed.
    None,
    /// Request `id` is generating.
    Running(u64),
    /// Request `id` finished; its output waits for [`RequestEngine::take_output`].
    Finished(u64),
}

/// One [`Engine`] serving requests one at a time (see the module docs).
pub struct SingleStream {
    engine: Engine,
    waiting: VecDeque<Waiting>,
    current: Current,
}

impl SingleStream {
    /// Serve requests on `engine`.
    #[must_use]
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            waiting: VecDeque::new(),
            current: Current::None,
        }
    }

    /// The engine (its options, e.g. [`Engine::set_prefix_caching`]).
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// The engine.
    #[must_use]
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    fn knows(&self, id: u64) -> bool {
        self.holds(id) || self.waiting.iter().any(|w| w.id == id)
    }

    /// The engine's request when it is `id` (running or finished).
    fn holds(&self, id: u64) -> bool {
        matches!(self.current, Current::Running(i) | Current::Finished(i) if i == id)
    }
}

impl RequestEngine for SingleStream {
    fn add_with(
        &mut self,
        id: u64,
        prompt: &[u32],
        cfg: GenerationConfig,
        constraint: Option<Box<dyn Constraint>>,
    ) -> Result<()> {
        if self.knows(id) {
            return Err(crate::request_engine::id_in_use(id));
        }
        // The checks Engine::start makes, now, so a bad request is refused before it queues.
        cfg.validate()?;
        check_prompt(
            prompt,
            cfg.max_new_tokens,
            self.engine.vocab_size(),
            self.engine.max_seq_len(),
        )?;
        self.waiting.push_back(Waiting {
            id,
            prompt: prompt.to_vec(),
            cfg,
            constraint,
        });
        Ok(())
    }

    fn step(&mut self) -> Result<Vec<RowStep>> {
        let (id, start) = match self.current {
            Current::Running(id) => (id, None),
            Current::None | Current::Finished(_) => match self.waiting.pop_front() {
                Some(w) => (w.id, Some(w)),
                None => return Ok(Vec::new()),
            },
        };
        // A finished request not yet taken is dropped by the next start, as Engine::start drops the last one.
        self.current = Current::Running(id);
        let round = match start {
            Some(w) => self
                .engine
                .start_with(&w.prompt, w.cfg, w.constraint)
                .and_then(|()| self.engine.step().cloned()),
            None => self.engine.step().cloned(),
        };
        match round {
            Ok(out) => {
                if out.finish_reason.is_some() {
                    self.current = Current::Finished(id);
                }
                Ok(vec![RowStep {
                    id,
                    out,
                    error: None,
                }])
            }
            Err(error) => {
                // The engine dropped the generation (its caches are in an unknown state); only this request fails.
                self.current = Current::None;
                Ok(vec![RowStep {
                    id,
                    out: StepOutput::default(),
                    error: Some(error),
                }])
            }
        }
    }

    fn cancel(&mut self, id: u64) -> Result<bool> {
        if let Some(i) = self.waiting.iter().position(|w| w.id == id) {
            self.waiting.remove(i);
            return Ok(true);
        }
        if self.holds(id) {
            // The engine keeps the request's state until the next start, which records what its caches hold.
            self.current = Current::None;
            return Ok(true);
        }
        Ok(false)
    }

    fn stop_at(&mut self, id: u64, n_keep: usize) -> Result<()> {
        if !self.holds(id) {
            return Err(SpecError::Config(format!(
                "request id {id} is neither running nor finished (expected an id given to add)"
            )));
        }
        self.engine.stop_at(n_keep)?;
        self.current = Current::Finished(id);
        Ok(())
    }

    fn take_output(&mut self, id: u64) -> Option<GenerationOutput> {
        if self.current != Current::Finished(id) {
            return None;
        }
        self.current = Current::None;
        self.engine.output().ok()
    }

    fn prompt_logprobs(&self, id: u64) -> Option<&PromptLogprobs> {
        if self.holds(id) {
            self.engine.prompt_logprobs()
        } else {
            None
        }
    }

    fn stats(&self, id: u64) -> Option<&Stats> {
        if self.holds(id) {
            self.engine.stats()
        } else {
            None
        }
    }

    fn last_stats(&self) -> Option<&Stats> {
        self.engine.stats()
    }

    fn vocab_size(&self) -> usize {
        self.engine.vocab_size()
    }

    fn has_draft(&self) -> bool {
        self.engine.has_draft()
    }

    fn max_seq_len(&self) -> usize {
        self.engine.max_seq_len()
    }

    fn max_batch(&self) -> usize {
        1
    }

    fn n_running(&self) -> usize {
        usize::from(matches!(self.current, Current::Running(_)))
    }

    fn n_waiting(&self) -> usize {
        self.waiting.len()
    }

    fn set_suffix_cache(&mut self, cache: Option<std::sync::Arc<crate::SuffixCache>>) {
        self.engine.set_suffix_cache(cache);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MockModel;

    fn engine() -> Engine {
        let target = MockModel::new(40, 256, 5, 3.0);
        let draft = target.clone().with_noise(2, 0.5);
        Engine::new(Box::new(target), Some(Box::new(draft))).unwrap()
    }

    fn cfg(seed: u64) -> GenerationConfig {
        let mut cfg = GenerationConfig {
            max_new_tokens: 12,
            ignore_eos: true,
            seed,
            ..GenerationConfig::default()
        };
        cfg.sampling.temperature = 1.0;
        cfg
    }

    /// Run `stream` until idle; the outputs in the order requests finished.
    fn drain(stream: &mut SingleStream) -> Vec<(u64, GenerationOutput)> {
        let mut done = Vec::new();
        for _ in 0..1000 {
            if stream.is_idle() {
                break;
            }
            for row in stream.step().unwrap() {
                assert!(row.error.is_none());
                if row.out.finish_reason.is_some() {
                    done.push((row.id, stream.take_output(row.id).unwrap()));
                }
            }
        }
        assert!(stream.is_idle(), "the requests never ended");
        done
    }

    #[test]
    fn queued_requests_run_in_order_with_the_engines_own_output() {
        let prompts: [&[u32]; 3] = [&[1, 2, 3], &[4, 5], &[1, 2, 3, 6]];
        let mut stream = SingleStream::new(engine());
        for (i, p) in prompts.iter().enumerate() {
            stream
                .add_with(10 + i as u64, p, cfg(i as u64), None)
                .unwrap();
        }
        assert_eq!((stream.n_waiting(), stream.n_running()), (3, 0));
        let err = stream.add_with(11, &[1], cfg(0), None).unwrap_err();
        assert!(err.to_string().contains("already in use"), "{err}");
        let done = drain(&mut stream);
        assert_eq!(done.iter().map(|d| d.0).collect::<Vec<_>>(), [10, 11, 12]);
        for (i, p) in prompts.iter().enumerate() {
            let alone = engine().generate(p, cfg(i as u64), |_| true).unwrap();
            assert_eq!(done[i].1.tokens, alone.tokens, "request {i}");
            assert_eq!(done[i].1.finish_reason, alone.finish_reason);
        }
    }

    #[test]
    fn cancel_stop_at_and_bad_requests() {
        let mut stream = SingleStream::new(engine());
        stream.add_with(1, &[1, 2], cfg(1), None).unwrap();
        stream.add_with(2, &[3, 4], cfg(2), None).unwrap();
        // Refused at add, nothing queued: an empty prompt, an id out of the vocabulary.
        assert!(stream.add_with(3, &[], cfg(3), None).is_err());
        assert!(matches!(
            stream.add_with(3, &[99], cfg(3), None),
            Err(SpecError::Vocab(_))
        ));
        assert!(stream.cancel(2).unwrap(), "a waiting request is cancelled");
        let first = stream.step().unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].id, 1);
        let n = first[0].out.tokens.len();
        stream.stop_at(1, n).unwrap();
        let out = stream.take_output(1).unwrap();
        assert_eq!(out.tokens.len(), n);
        assert_eq!(out.finish_reason, crate::FinishReason::Stop);
        assert!(stream.is_idle());
        assert!(!stream.cancel(2).unwrap(), "already gone");
        assert!(
            stream.stop_at(1, 0).is_err(),
            "taken: neither running nor finished"
        );
    }
}
