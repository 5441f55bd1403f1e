"""Switchyard, the routing proxy: its profiles, discovery of its routes, and running it (attached, hosted or launched).

Its public surface is its modules (`__all__`): `proxy` imports `profiles` through this package, so
re-exporting `proxy`'s names here would be an import cycle.
"""

__all__ = ["discovery", "interpolation", "profiles", "provenance", "proxy", "redaction", "runtime"]
