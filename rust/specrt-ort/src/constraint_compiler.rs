//! [`ConstraintCompiler`]: a request's [`OutputConstraint`] compiled into a fresh matcher for one model's tokenizer
//! (the llguidance parser factory built once, on the first constrained request). The Rust [`crate::Pipeline`], the
//! batched pipeline and the Python binding's single-stream `Engine` all compile through it.

use std::path::Path;

use specrt_core::{Constraint, Result, SpecError};
use specrt_grammar::{GrammarCompiler, OutputConstraint};
use specrt_text::tokenizer::Tokenizer;

use crate::folder::{folder_tokenizer, TOKENIZER_FILE};

/// Compiles constraints for one model: its tokenizer, its vocabulary size (logits width) and the EOS ids, with
/// llguidance's parser factory built lazily (building it reads the whole vocabulary: tens of ms) and rebuilt only
/// when the EOS ids change.
pub struct ConstraintCompiler {
    tokenizer: Option<Tokenizer>,
    vocab_size: usize,
    eos_token_ids: Vec<u32>,
    grammar: Option<GrammarCompiler>,
}

impl ConstraintCompiler {
    /// A compiler over `tokenizer` (`None`: constrained requests are refused, naming the missing `tokenizer.json`)
    /// for a model with `vocab_size` logits whose end of sequence is any of `eos_token_ids`.
    #[must_use]
    pub fn new(tokenizer: Option<Tokenizer>, vocab_size: usize, eos_token_ids: Vec<u32>) -> Self {
        Self {
            tokenizer,
            vocab_size,
            eos_token_ids,
            grammar: None,
        }
    }

    /// A compiler over the `tokenizer.json` beside model file (or in model folder) `model`.
    ///
    /// Errors: [`SpecError::Io`] / [`SpecError::ModelFormat`] for a tokenizer.json that cannot be read / parsed.
    pub fn from_folder(model: &Path, vocab_size: usize, eos_token_ids: Vec<u32>) -> Result<Self> {
        let file = if model.is_dir() {
            model.join(TOKENIZER_FILE)
        } else {
            model.to_path_buf()
        };
        Ok(Self::new(
            folder_tokenizer(&file)?,
            vocab_size,
            eos_token_ids,
        ))
    }

    /// Use `tokenizer` from now on (the parser factory is rebuilt on the next compile).
    pub fn set_tokenizer(&mut self, tokenizer: Tokenizer) {
        self.tokenizer = Some(tokenizer);
        self.grammar = None;
    }

    /// Use `eos_token_ids` from now on (the parser factory is rebuilt on the next compile when they differ).
    pub fn set_eos_token_ids(&mut self, eos_token_ids: &[u32]) {
        if self.eos_token_ids != eos_token_ids {
            eos_token_ids.clone_into(&mut self.eos_token_ids);
            self.grammar = None;
        }
    }

    /// The EOS ids the masks treat as end of sequence.
    #[must_use]
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// llguidance's parser factory over the tokenizer (built on first use).
    ///
    /// Errors: [`SpecError::Config`] without a tokenizer or EOS ids, or for a tokenizer llguidance cannot read.
    pub fn grammar(&mut self) -> Result<&GrammarCompiler> {
        if self.grammar.is_none() {
            let tokenizer = self.tokenizer.as_ref().ok_or_else(|| {
                SpecError::Config(format!(
                    "structured output needs the target folder's {TOKENIZER_FILE} (none was found)"
                ))
            })?;
            self.grammar = Some(GrammarCompiler::new(
                tokenizer,
                self.vocab_size,
                &self.eos_token_ids,
            )?);
        }
        Ok(self.grammar.as_ref().expect("just built"))
    }

    /// A fresh matcher of `constraint` (its state: nothing consumed).
    ///
    /// Errors: as [`ConstraintCompiler::grammar`]; [`SpecError::Setting`] naming the constraint's kind when it does
    /// not compile.
    pub fn compile(&mut self, constraint: &OutputConstraint) -> Result<Box<dyn Constraint>> {
        Ok(Box::new(self.grammar()?.compile(constraint)?))
    }

    /// [`ConstraintCompiler::compile`] of an optional constraint (`None` in, `None` out) with the request's EOS ids
    /// (`eos_token_ids`: the resolved `GenerationConfig`'s, so that the masks' EOS set is the engine's).
    ///
    /// Errors: as [`ConstraintCompiler::compile`].
    pub fn compile_for(
        &mut self,
        constraint: Option<&OutputConstraint>,
        eos_token_ids: &[u32],
    ) -> Result<Option<Box<dyn Constraint>>> {
        let Some(c) = constraint else {
            return Ok(None);
        };
        self.set_eos_token_ids(eos_token_ids);
        self.compile(c).map(Some)
    }
}
