"""Token-exact capture: records, the durable store, and rollout reconstruction."""
