"""Reading capture back: the store and its files, delta and shared-prompt reads, contiguity, timelines, rollout rebuilds."""
