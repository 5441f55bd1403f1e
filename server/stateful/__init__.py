"""The stateful Responses API: stored responses, conversations, background runs, sealed reasoning."""
