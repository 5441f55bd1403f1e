"""The client of the upstream (Switchyard): its HTTP/1.1 connections, replies and streams, and its errors.

Its public surface is its modules (`__all__`): `client` and `errors` import `http1` through this
package, so re-exporting their names here would be an import cycle.
"""

__all__ = ["client", "http1"]
