"""Pure ASGI middleware for switchyard-model (correlation and request guards)."""
