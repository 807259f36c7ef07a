"""Chat models as the LLM-call machinery sees them: their identity (for cache keys), the
text of their replies, secrets to redact, and their own SDK retries turned off."""

from __future__ import annotations

import logging
from typing import Any

from langchain_core.runnables import RunnableWithFallbacks
from langchain_core.runnables.base import RunnableBindingBase
from pydantic import BaseModel, SecretStr

__all__ = [
    "message_text",
    "model_identity",
    "redact_secrets",
    "underlying_model",
    "without_model_retries",
]

logger = logging.getLogger(__name__)


def message_text(message: Any) -> str:
    """The text of a chat model reply (string content or text content blocks)."""
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
    return "".join(parts)


def underlying_model(llm: Any) -> Any:
    """The chat model inside LangChain wrappers: ``bind``/``with_config``/``with_retry``
    (``RunnableBindingBase``: ``.bound``) and ``with_fallbacks`` (``.runnable``, the primary)."""
    while isinstance(llm, (RunnableBindingBase, RunnableWithFallbacks)):
        llm = llm.bound if isinstance(llm, RunnableBindingBase) else llm.runnable
    return llm


def model_identity(llm: Any) -> str:
    """``"<ChatModelClass>:<model name>"``: enough to key a cache, no secrets. Wrappers are
    looked through, so ``llm.with_config(...)`` shares the cache of ``llm``."""
    llm = underlying_model(llm)
    name = ""
    for attribute in ("model_name", "model", "model_id", "deployment_name"):
        value = getattr(llm, attribute, None)
        if isinstance(value, str) and value:
            name = value
            break
    return f"{type(llm).__name__}:{name}"


def redact_secrets(text: str, llm: Any) -> str:
    """``text`` with every ``SecretStr`` value of the model in ``llm`` (an API key, say) as
    ``***`` (a proxy may echo the request's headers into an error message)."""
    model = underlying_model(llm)
    for value in vars(model).values() if hasattr(model, "__dict__") else ():
        if isinstance(value, SecretStr):
            secret = value.get_secret_value()
            if secret:
                text = text.replace(secret, "***")
    return text


_CLIENT_FIELDS = ("client", "async_client", "root_client", "root_async_client")
"""Fields in which LangChain chat models keep SDK clients built from their other fields."""
_SDK_DEFAULT_RETRIES = 2
"""What ``max_retries=None`` means for the openai and anthropic SDKs."""


def without_model_retries(llm: Any) -> tuple[Any, int]:
    """``llm`` with the chat models in it rebuilt with ``max_retries=0``, and the retries left.

    A chat model with a ``max_retries`` field (ChatOpenAI, ChatAnthropic, …; ChatOpenAI's
    ``None`` means the SDK's default of 2) is rebuilt from its fields with
    ``max_retries=0``; its SDK clients (``client``, ``root_client``, …) are built again by the
    model from the other fields, which are kept (key, base URL, ``http_client``, callbacks,
    rate limiter…). Wrappers are rebuilt around the copies: ``bind``/``with_config``/
    ``with_retry`` (whose own attempts stay: they are the caller's choice) and
    ``with_fallbacks`` (primary and fallbacks). A model that cannot be rebuilt is kept, and
    its retries come back as the second value for the caller to count.
    """
    if isinstance(llm, RunnableBindingBase):
        bound, left = without_model_retries(llm.bound)
        return (llm if bound is llm.bound else llm.model_copy(update={"bound": bound})), left
    if isinstance(llm, RunnableWithFallbacks):
        primary, left = without_model_retries(llm.runnable)
        fallbacks = []
        for fallback in llm.fallbacks:
            copy, fallback_left = without_model_retries(fallback)
            fallbacks.append(copy)
            left = max(left, fallback_left)
        update = {"runnable": primary, "fallbacks": fallbacks}
        return llm.model_copy(update=update), left
    return _model_without_retries(llm)


def _model_without_retries(model: Any) -> tuple[Any, int]:
    fields = type(model).model_fields if isinstance(model, BaseModel) else {}
    current = getattr(model, "max_retries", 0) if "max_retries" in fields else 0
    if current == 0 or isinstance(current, bool) or not isinstance(current, (int, type(None))):
        return model, 0
    own = current if isinstance(current, int) else _SDK_DEFAULT_RETRIES
    data = {
        _input_name(name, info): None if name in _CLIENT_FIELDS else getattr(model, name)
        for name, info in fields.items()
    }
    data[_input_name("max_retries", fields["max_retries"])] = 0
    try:
        copy = type(model).model_validate(data)
        if copy.max_retries != 0 or model_identity(copy) != model_identity(model):
            raise ValueError("the copy differs from the model")
    except Exception as error:
        logger.warning(
            "could not turn off the own retries of %s (%s: %s); its %d retries are counted "
            "against the caller's",
            type(model).__name__,
            type(error).__name__,
            str(error)[:200],
            own,
        )
        return model, own
    return copy, 0


def _input_name(name: str, info: Any) -> str:
    """The key that sets field ``name`` in ``model_validate`` (its alias when it has one)."""
    for alias in (info.validation_alias, info.alias):
        if isinstance(alias, str):
            return alias
    return name
