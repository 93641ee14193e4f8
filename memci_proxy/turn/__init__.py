"""The path of one managed chat turn: identity, session lock, planning, persistence, relay, feedback."""
