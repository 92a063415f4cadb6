//! Karpenter's KWOK provider on the real control plane: its CRDs, the controller process, a
//! NodePool and KWOKNodeClass, and nodes it provisions for pending pods.
