//! The shared-buffer KV layout's binding: one preallocated buffer per layer and kind, bound as both the past input
//! and the present output (GroupQueryAttention appends in place). Used by the main binding, the prefill graph's and
//! every CUDA-graph step's.

use ort::{session::IoBinding, value::DynTensor};
use specrt_core::{Result, SpecError};

use crate::model::{past_name, present_name};
use crate::runtime::ort_err;

/// Bind the shared KV `buffers` (`[l0.key, l0.value, l1.key, ...]`) as the past inputs and the present outputs of
/// `binding` (the same memory: GroupQueryAttention appends in place).
pub(crate) fn bind_kv_buffers(binding: &mut IoBinding, buffers: &mut [DynTensor]) -> Result<()> {
    for (i, buffer) in buffers.iter_mut().enumerate() {
        let (layer, kind) = (i / 2, if i % 2 == 0 { "key" } else { "value" });
        binding
            .bind_input(past_name(layer, kind), &*buffer)
            .map_err(|e| ort_err("binding a past KV input", &e))?;
        let alias = buffer
            .view_mut()
            .try_upgrade()
            .map_err(|_| SpecError::Internal("KV buffer view is not upgradable".into()))?;
        binding
            .bind_output(present_name(layer, kind), alias)
            .map_err(|e| ort_err("binding a present KV output", &e))?;
    }
    Ok(())
}
