//! Unit tests of `drill.rs`.

use super::*;
use clap::ValueEnum;

#[test]
fn every_listed_name_is_accepted_on_the_command_line_and_in_reports() {
    for kind in DrillKind::ALL {
        let parsed = DrillKind::from_str(kind.name(), false)
            .unwrap_or_else(|e| panic!("`run --drill {}` refused: {e}", kind.name()));
        assert_eq!(parsed, kind);
        let json = serde_json::to_string(&kind).expect("serialize");
        assert_eq!(json, format!("\"{}\"", kind.name()));
    }
}
