"""NeMo Gym's token-store adapters: Gym's training-token store, its Messages shape, its evaluation call capture."""

from __future__ import annotations

from server.capture.gym.calls import GymCallLog
from server.capture.gym.messages import responses_request, served_response, with_call_ids
from server.capture.gym.tokens import GymTokenCapture, chat_with_gym_tokens, request_items

__all__ = [
    "GymCallLog",
    "GymTokenCapture",
    "chat_with_gym_tokens",
    "request_items",
    "responses_request",
    "served_response",
    "with_call_ids",
]
