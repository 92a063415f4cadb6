//! State both reconcilers share: the reflector stores of the watched kinds, and leadership
//! (the Lease and the flag every write checks).

pub mod leadership;
pub mod lease;
pub mod stores;

pub use leadership::Leadership;
pub use stores::Stores;
