"""Token-continuity injection: send the engine each session's canonical token history (docs/injection.md)."""
