"""Token-exact capture, by job: write/, catalog/, read/, rollout/ and gym/; tokens.py the token triple rules they share.

The subpackages import `tokens` from here, so `__all__` lists the public module, not its names
(re-exporting them here would make every subpackage import a cycle through this one).
"""

__all__ = ["tokens"]
