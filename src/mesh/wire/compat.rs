//! Rolling upgrades (unit tests of the wire): the frames of the previous release's wire (version 8), recorded from a
//! fixed three-node scenario run by that release (`tests/fixtures/wire8-frames.txt`), are
//! the very frames this build sends in the same scenario, byte for byte, and every one of
//! them passes this build's checks. A change that alters the bytes of any frame fails here:
//! it must then keep speaking the previous version beside the new one (docs/operations.md).

use std::collections::BTreeSet;

use super::check::decode as decode_frame;
use crate as ratemesh;
use crate::mesh::message::Item;

include!("../../../tests/support/wire_scenario.rs");

fn recorded() -> Vec<(u64, u64, bool, Vec<u8>)> {
    include_str!("../../../tests/fixtures/wire8-frames.txt")
        .lines()
        .map(|line| {
            let parts: Vec<&str> = line.split(' ').collect();
            let bytes = (0..parts[3].len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&parts[3][i..i + 2], 16).unwrap())
                .collect();
            (
                parts[0].parse().unwrap(),
                parts[1].parse().unwrap(),
                parts[2] == "1",
                bytes,
            )
        })
        .collect()
}

#[test]
fn this_build_sends_the_previous_releases_frames_byte_for_byte() {
    let recorded = recorded();
    let sent = wire_scenario();
    assert_eq!(sent.len(), recorded.len(), "frames sent");
    for (i, (ours, theirs)) in sent.iter().zip(&recorded).enumerate() {
        assert_eq!(ours, theirs, "frame {i} (from, to, reliable, bytes)");
    }
}

#[test]
fn the_previous_releases_frames_pass_this_builds_checks_and_cover_every_item_kind() {
    let policies = scenario_policies();
    let mut kinds = BTreeSet::new();
    for (from, to, _, bytes) in recorded() {
        let frame = decode_frame(&bytes, &policies)
            .unwrap_or_else(|e| panic!("a frame from {from} to {to} refused: {e}"));
        for item in &frame.items {
            kinds.insert(match item {
                Item::Want(_) => "want",
                Item::Grant(_) => "grant",
                Item::Recall { .. } => "recall",
                Item::Backup(_) => "backup",
                Item::Handoff(_) => "handoff",
                Item::Restore(_) => "restore",
                Item::NotOwner(_) => "not_owner",
                Item::SyncDone => "sync_done",
                Item::Retired => "retired",
                Item::Members(_) => "members",
                Item::Limits(_) => "limits",
                Item::Ext(_) => "ext",
            });
        }
    }
    for kind in ["want", "grant", "backup", "handoff", "sync_done", "members"] {
        assert!(kinds.contains(kind), "no {kind} item among {kinds:?}");
    }
}
