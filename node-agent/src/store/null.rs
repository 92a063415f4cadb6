//! `NullStore`: used when no state directory is configured. Writes succeed and keep nothing;
//! loads are refused, and `can_recover()` is false, so callers need no "if recovery" checks.

use std::collections::BTreeMap;

use super::records::*;
use super::{StateStore, StoreError};

#[derive(Clone, Copy, Debug, Default)]
pub struct NullStore;

impl StateStore for NullStore {
    fn can_recover(&self) -> bool {
        false
    }
    fn apply(&self, _ops: &[Op]) -> Result<(), StoreError> {
        Ok(())
    }
    fn load_containers(&self) -> Result<ContainersState, StoreError> {
        Err(StoreError::NotRecoverable)
    }
    fn load_localization(&self) -> Result<Vec<LocalizationEntry>, StoreError> {
        Err(StoreError::NotRecoverable)
    }
    fn load_applications(&self) -> Result<BTreeMap<AppId, AppRecord>, StoreError> {
        Err(StoreError::NotRecoverable)
    }
    fn load_tokens(&self) -> Result<TokenState, StoreError> {
        Err(StoreError::NotRecoverable)
    }
    fn load_deletion_tasks(&self) -> Result<BTreeMap<u64, DeletionTask>, StoreError> {
        Err(StoreError::NotRecoverable)
    }
}
