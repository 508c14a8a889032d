"""Pure domain: events, run state, scheduler policy, scoring, problems. No processes."""
