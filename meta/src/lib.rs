//! Placeholder: this crate is built in a later step (see the project issues).
#![forbid(unsafe_code)]
