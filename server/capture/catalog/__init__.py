"""The catalog of captured sessions: the session index, owners, server runs, summaries and session trees."""
