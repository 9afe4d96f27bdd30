"""The model's own tokenizer and chat template, loaded from a model directory.

A model directory (a Hugging Face snapshot) holds ``tokenizer.json`` (read with the PyPI
``tokenizers`` library) and ``tokenizer_config.json``; the chat template is the config's
``chat_template`` (a string, or a list of ``{name, template}`` of which ``default`` is used),
or ``chat_template.jinja`` beside it, which takes precedence as in ``transformers``.

The template is rendered as ``transformers`` renders it (``apply_chat_template``): a sandboxed
Jinja environment (``ImmutableSandboxedEnvironment``, ``trim_blocks``, ``lstrip_blocks``,
``loopcontrols``), the globals ``raise_exception`` and ``strftime_now``, the ``tojson``
filter, and the variables ``messages``, ``tools`` (the engine kind's form of the request's
tools, :mod:`~services.common.tokens.engine_chat`), ``add_generation_prompt=True`` and the
special tokens of the config (``bos_token``, ``eos_token``, ...). The rendered text is encoded without
adding special tokens (the template already holds them), as vLLM and SGLang do for chat
requests; a completion prompt is encoded with them (``add_special_tokens=True``), as both
engines do.

Content parts (``chat.py``): a template that iterates over ``message['content']`` (vLLM's and
SGLang's "openai" content format, detected the same way, from the template's syntax tree) gets
the text parts; any other template gets them joined by the engine kind's separator.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from services.common.tokens.chat import ChatError, ChatMessage, flatten

__all__ = ["ModelDirError", "ModelTokenizer", "load_model_tokenizer"]


class ModelDirError(ValueError):
    """The model directory cannot be used (missing or unreadable tokenizer files)."""


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _token_text(value: Any) -> str | None:
    """A special token of tokenizer_config.json: a string or a serialised AddedToken."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _iterates_content(env: jinja2.Environment, template: str) -> bool:
    """Whether the template loops over ``message['content']`` ("openai" content format)."""
    try:
        tree = env.parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    for loop in tree.find_all(jinja2.nodes.For):
        it = loop.iter
        while isinstance(it, jinja2.nodes.Filter) and it.node is not None:
            it = it.node
        if isinstance(it, jinja2.nodes.Getattr) and it.attr == "content":
            target = it.node
        elif (
            isinstance(it, jinja2.nodes.Getitem)
            and isinstance(it.arg, jinja2.nodes.Const)
            and it.arg.value == "content"
        ):
            target = it.node
        else:
            continue
        if isinstance(target, jinja2.nodes.Name) and target.name in ("message", "msg", "m"):
            return True
    return False


class ModelTokenizer:
    """A model's tokenizer + chat template (see the module doc). Build with
    :func:`load_model_tokenizer` (cached per directory)."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        tok_file, cfg_file = model_dir / "tokenizer.json", model_dir / "tokenizer_config.json"
        for f in (tok_file, cfg_file):
            if not f.is_file():
                raise ModelDirError(
                    f"model directory {model_dir} has no {f.name} (it needs tokenizer.json "
                    "and tokenizer_config.json)"
                )
        try:
            self._tok = HFTokenizer.from_file(str(tok_file))
            config = json.loads(cfg_file.read_text(encoding="utf-8"))
        except Exception as e:  # tokenizers raises plain Exception
            raise ModelDirError(f"model directory {model_dir}: {e}") from None
        if not isinstance(config, dict):
            raise ModelDirError(f"{cfg_file}: not a JSON object")
        self._specials = {
            k: text
            for k, v in config.items()
            if k.endswith("_token") and (text := _token_text(v)) is not None
        }
        template = self._template(config)
        self._env = _environment()
        try:
            self._template_obj = self._env.from_string(template) if template else None
        except jinja2.TemplateSyntaxError as e:
            raise ModelDirError(f"{model_dir}: chat template: {e}") from None
        self.structured_content = bool(template) and _iterates_content(self._env, template)

    @property
    def name(self) -> str:
        return f"model:{self.model_dir}"

    def _template(self, config: dict[str, Any]) -> str:
        jinja_file = self.model_dir / "chat_template.jinja"
        if jinja_file.is_file():
            return jinja_file.read_text(encoding="utf-8")
        t = config.get("chat_template")
        if isinstance(t, list):
            named = {e.get("name"): e.get("template") for e in t if isinstance(e, dict)}
            t = named.get("default")
        return t if isinstance(t, str) else ""

    def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt (with the model's special tokens)."""
        return list(self._tok.encode(text, add_special_tokens=True).ids)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=True).ids)

    def render_chat(
        self,
        messages: list[ChatMessage],
        part_sep: str = " ",
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The chat template applied to validated messages and ``tools`` (None = the request
        has none, as ``transformers`` passes it). Raises :class:`ChatError` when the model
        has no template or the template refuses the conversation."""
        if self._template_obj is None:
            raise ChatError(
                f"the model at {self.model_dir} has no chat template", code="no_chat_template"
            )
        if not self.structured_content:
            messages = [{**m, "content": flatten(m["content"], part_sep)} for m in messages]
        try:
            return self._template_obj.render(
                messages=messages, tools=tools, add_generation_prompt=True, **self._specials
            )
        except jinja2.TemplateError as e:
            raise ChatError(f"chat template: {e}", code="chat_template_error") from None

    def encode_chat(
        self,
        messages: list[ChatMessage],
        part_sep: str = " ",
        tools: list[dict[str, Any]] | None = None,
        special_tokens: bool = False,
    ) -> list[int]:
        """Token ids of a chat prompt: the rendered template, the tokenizer's special tokens
        added only with ``special_tokens``."""
        text = self.render_chat(messages, part_sep, tools)
        return list(self._tok.encode(text, add_special_tokens=special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=False))

    def single_token_words(self, limit: int = 4096) -> list[str]:
        """Up to ``limit`` alphabetic words that encode, after a space, as exactly one token
        (sorted; deterministic for a given tokenizer). The bench builds prompts of them."""
        out: list[str] = []
        for _piece, tid in sorted(self._tok.get_vocab().items()):
            word = self._tok.decode([tid]).strip()
            if len(word) < 2 or not word.isascii() or not word.isalpha():
                continue
            if len(self._tok.encode(" " + word, add_special_tokens=False).ids) == 1:
                out.append(word)
            if len(out) >= limit:
                break
        return sorted(set(out))


@lru_cache(maxsize=16)
def _load(resolved: str) -> ModelTokenizer:
    return ModelTokenizer(Path(resolved))


def load_model_tokenizer(model_dir: str | Path) -> ModelTokenizer:
    """The tokenizer of ``model_dir``, loaded once per directory. Raises ModelDirError."""
    path = Path(model_dir).expanduser()
    if not path.is_dir():
        raise ModelDirError(f"model directory {path} does not exist")
    return _load(str(path.resolve()))
