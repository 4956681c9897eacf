//! Recording a field's error: the one helper every part of the configuration reports through. A leaf, so that
//! the parts can share it without importing each other.

use kcp_keeper_runtime::config::FieldError;

/// Records `result`'s reason, if any, under `path`.
pub(super) fn check(errors: &mut Vec<FieldError>, path: String, result: Result<(), String>) {
    if let Err(reason) = result {
        errors.push(FieldError::new(path, reason));
    }
}
