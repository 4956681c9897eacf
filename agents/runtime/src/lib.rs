//! What every kcp-keeper agent shares: CLI, configuration, logging, admin server, leader election, writes.
//! Built by the agent runtime issue.
