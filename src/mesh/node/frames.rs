//! A frame from a peer: checked whole by the wire ([`crate::mesh::wire::check`]), its header
//! heard by the membership, then each item handed to the part of the node it is for (the
//! key's holding, its authority, the sync, the members, the limits).

use super::Node;
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::message::{Frame, Item};
use crate::mesh::timing::Offset;
use crate::mesh::wire::check::{self, FrameError};

impl Node {
    /// Apply a frame from peer `from` received at `now`. A frame that fails any check is
    /// refused whole: nothing it carried is applied.
    pub fn handle_frame(
        &mut self,
        now: Nanos,
        from: NodeId,
        bytes: &[u8],
    ) -> Result<(), FrameError> {
        let result = check::decode(bytes, self.limits.enforced())
            .and_then(|frame| self.apply_frame(now, from, frame));
        self.count_frame(now, &result);
        result
    }

    fn count_frame(&mut self, now: Nanos, result: &Result<(), FrameError>) {
        match result {
            Ok(()) => self.stats.frames_received += 1,
            Err(_) => self.stats.frames_dropped += 1,
        }
        self.flush(now);
    }

    fn apply_frame(
        &mut self,
        now: Nanos,
        from: NodeId,
        mut frame: Frame,
    ) -> Result<(), FrameError> {
        if from == self.config.id || self.membership.peer(from).is_none() {
            return Err(FrameError::UnknownPeer(from));
        }
        let changes = self.membership.heard(now, from, &frame.header);
        // A leaving peer's frame hands its authorities over along with the news that it
        // leaves: they are installed first, so that nothing the news sets off (a holding
        // asking its key's new owner) finds the key without its authority and makes one
        // of a backup, or afresh, that would grant again what the handed-over one granted.
        for item in frame
            .items
            .extract_if(.., |i| matches!(i, Item::Handoff(_)))
        {
            if let Item::Handoff(state) = item {
                self.on_handoff(now, from, state);
            }
        }
        self.apply_changes(now, &changes);
        self.heard_digest(from, frame.header.digest);
        self.check_deaths(now, from);
        let incarnation = frame.header.incarnation;
        // Sent before the peer heard that this node restarted: its grants and recalls are
        // about the leases of this node's earlier run.
        let to_earlier_run = frame.header.to_incarnation != 0
            && frame.header.to_incarnation != self.membership.incarnation();
        if frame.header.syncing && !self.transfers.has_answered(from, incarnation) {
            self.answer_sync(now, from, incarnation);
        }
        for item in frame.items {
            match item {
                Item::Want(mut w) => {
                    // Its last counted admission was at least `spent_ago` before the want,
                    // which left no later than the frame: here, no later than the latest
                    // local instant the frame's send time can be.
                    if let Some(o) = self.membership.offset(from, now) {
                        let at = o.latest_local(frame.header.sent_at.saturating_sub(w.spent_ago));
                        w.spent_ago = w.spent_ago.max(now.saturating_sub(at));
                    }
                    self.on_want(now, from, incarnation, w)
                }
                Item::Grant(_) | Item::Recall { .. } if to_earlier_run => {
                    self.stats.to_earlier_run += 1;
                }
                Item::Grant(g) => self.on_grant(now, from, g),
                Item::Recall { key, keep } => {
                    // Give back what it can, and report either way: the authority then knows
                    // what can still be had.
                    if let Some(h) = self.holdings.get_mut(&key) {
                        h.recall(keep);
                        self.ask(key, now, false);
                    }
                }
                Item::Backup(state) => {
                    if self.authorities.contains_key(&state.key) {
                        continue;
                    }
                    // A kept backup that would be idle by now goes first, as the next sweep
                    // would drop it: its owner may have dropped that run of the key's
                    // authority and begun another, whose versions begin again below it.
                    if self.backup_is_idle(&state.key, now) {
                        self.backups.remove(&state.key);
                    }
                    self.backups.keep(from, state);
                }
                Item::Handoff(state) => self.on_handoff(now, from, state),
                Item::Restore(state) => {
                    // Its times are on this node's clock, before the restart.
                    let me = self.config.id;
                    let error = self.config.gossip_interval_ns;
                    self.install(
                        now,
                        me,
                        Offset {
                            offset: 0,
                            error,
                            round_trip: 0,
                        },
                        state,
                    );
                }
                Item::NotOwner(key) => {
                    // The holder's view and the peer's differ: ask again at the next round.
                    if let Some(h) = self.holdings.get_mut(&key) {
                        h.report_due();
                        self.schedule.touch(key);
                    }
                }
                Item::SyncDone => {
                    self.transfers.answered_by(from);
                    self.join_answered(now, from);
                    self.finish_sync();
                }
                // Refused by the frame's checks.
                Item::Retired => {}
                Item::Members(list) => self.on_members(now, from, &list),
                Item::Limits(limits) => self.on_limits(from, limits),
                Item::Ext(ext) => self.on_ext(now, from, ext),
            }
        }
        Ok(())
    }
}
