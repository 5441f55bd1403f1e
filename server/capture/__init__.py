"""Token-exact capture, by job: write/, catalog/, read/, rollout/ and gym/; tokens.py the token triple rules they share."""
