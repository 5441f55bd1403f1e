"""`python -m server.dev.mock_upstream`: serve the mock upstream on a host and port."""

from server.dev.mock_upstream.command import main

main()
