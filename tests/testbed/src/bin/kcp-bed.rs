//! `kcp-bed <dir>`: the kcp bed that `cargo xtask test` shares across test binaries. Starts kcp (root and alpha
//! shards, an etcd each, the front proxy) under `<dir>`, describes it in `<dir>/bed.json` for test binaries run
//! with `KCP_KEEPER_TEST_KCP=<dir>/bed.json`, and runs until its standard input closes. See
//! `testbed::kcp::shared_bed`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: kcp-bed <dir>");
        return ExitCode::from(2);
    };
    match testbed::kcp::shared_bed::serve(&PathBuf::from(dir)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kcp-bed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
