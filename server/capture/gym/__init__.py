"""NeMo Gym's token-store adapters: Gym's training-token store, its Messages shape, its evaluation call capture."""
