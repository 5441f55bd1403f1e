"""NeMo Gym's token-store adapters: Gym's training-token store, its Messages shape, its evaluation call capture.

Its public surface is its modules (`__all__`), as for the rest of capture: each caller takes one
adapter (`messages`, `tokens` or `calls`) and needs none of the others loaded.
"""

__all__ = ["calls", "messages", "tokens"]
