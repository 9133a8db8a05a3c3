"""The OpenAI Realtime wire format on the ``oai-events`` data channel."""
