//! pgmend: migrate a live PostgreSQL database that already holds broken data, repair it
//! safely, and report what the breakage cost. See ARCHITECTURE.md for the map.

pub mod cli;
pub mod commands;
pub mod config;
pub mod db;
pub mod demo_data;
pub mod digest;
pub mod error;
pub mod human;
pub mod localpg;
pub mod manpage;
pub mod metrics;
pub mod migrate;
pub mod online;
pub mod output;
pub mod preflight;
pub mod release;
pub mod repair;
pub mod report;
pub mod signals;
pub mod statements;
pub mod store;
pub mod verify;
