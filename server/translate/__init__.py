"""Translation between the Responses and Messages APIs and the chat completions the upstream speaks."""

from __future__ import annotations

from server.translate.accumulate import ChatStreamAccumulator, chunks_from_completion
from server.translate.checks import check_counts, check_metadata
from server.translate.messages_request import MESSAGES_FIELDS, MessagesChatRequest, messages_to_chat
from server.translate.messages_response import chat_to_message
from server.translate.messages_stream import MessagesStreamTranslator, encode_events
from server.translate.request import RESPONSES_FIELDS, responses_to_chat
from server.translate.response import chat_to_response, id_base, response_base, response_to_chat
from server.translate.stream import ResponsesStreamTranslator
from server.translate.tools import ToolMap

__all__ = [
    "chat_to_message",
    "chat_to_response",
    "ChatStreamAccumulator",
    "check_counts",
    "check_metadata",
    "chunks_from_completion",
    "encode_events",
    "id_base",
    "MESSAGES_FIELDS",
    "messages_to_chat",
    "MessagesChatRequest",
    "MessagesStreamTranslator",
    "response_base",
    "response_to_chat",
    "RESPONSES_FIELDS",
    "responses_to_chat",
    "ResponsesStreamTranslator",
    "ToolMap",
]
