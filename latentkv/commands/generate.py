"""`latentkv generate [MODEL] --prompt ...` (one-shot) and `latentkv chat [MODEL]`
(interactive), both streaming text to the terminal as it is generated."""

from __future__ import annotations

import itertools
import sys

from latentkv.commands.interrupt import Interrupted, close, exit_status, sigterm_unwinds
from latentkv.commands.startup import start_engine
from latentkv.engine.chat_template import render_chat
from latentkv.sampling_params import SamplingParams
from latentkv.settings import add_engine_arguments, settings_from_args

CHAT_HELP = "commands: /exit (or Ctrl-D) to leave, /reset to forget the conversation"


def register(subparsers) -> None:
    gen = subparsers.add_parser("generate", help="generate a completion for one prompt, streamed to stdout")
    add_engine_arguments(gen)
    gen.add_argument("--prompt", required=True, help="the prompt text ('-' reads stdin)")
    gen.add_argument("--chat", action="store_true", help="send the prompt as a user message through the chat template")
    add_sampling_arguments(gen, temperature=0.0)
    gen.set_defaults(func=run_generate)

    chat = subparsers.add_parser("chat", help="chat with a model in the terminal")
    add_engine_arguments(chat)
    chat.add_argument("--system", default=None, help="a system message to start the conversation")
    add_sampling_arguments(chat, temperature=0.7)
    chat.set_defaults(func=run_chat)


def add_sampling_arguments(parser, temperature: float) -> None:
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens to generate at most (default 256)")
    parser.add_argument("--temperature", type=float, default=temperature, help=f"0 is greedy (default {temperature})")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)


def sampling_params(args) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
    )


def load(args, what: str):
    """-> (a started engine, the sampling params, the shutdown timeout), or (None, None, 0) after
    printing why not."""
    try:
        params = sampling_params(args)
        settings = settings_from_args(args)
        engine, _ = start_engine(settings)
    except ValueError as err:  # a bad setting, no such model, a bad checkpoint, a cache that holds nothing, ...
        print(f"latentkv {what}: {err}", file=sys.stderr)
        return None, None, 0.0
    return engine, params, settings.shutdown_timeout


_ids = itertools.count()


def stream_text(engine, text: str | None, ids: list[int] | None, params):
    """Run one request on the engine, yielding new text as it is generated; the last
    item yielded is the final RequestOutput."""
    request_id = f"cli-{next(_ids)}"
    engine.add_request(request_id, text, params, prompt_token_ids=ids)
    shown = 0
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id != request_id:
                    continue
                text_now = out.outputs[0].text
                if len(text_now) > shown:
                    yield text_now[shown:]
                    shown = len(text_now)
                if out.finished:
                    yield out
                    return
    finally:
        engine.abort_request(request_id)


def write_stream(chunks) -> object:
    """Print text chunks as they come; return the final output."""
    final = None
    for chunk in chunks:
        if isinstance(chunk, str):
            sys.stdout.write(chunk)
            sys.stdout.flush()
        else:
            final = chunk
    return final


def run_generate(args) -> int:
    """Generate, then close the engine (the KV store's queue written), also when SIGTERM or Ctrl-C
    stops it (exit 128 + the signal)."""
    engine = None
    timeout = 0.0
    with sigterm_unwinds():
        try:
            engine, params, timeout = load(args, "generate")
            return generate(engine, params, args) if engine is not None else 2
        except KeyboardInterrupt as err:
            sys.stdout.write("\n")
            return exit_status(err)
        finally:
            close(engine, timeout)


def generate(engine, params, args) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        if args.chat:
            text, ids = render_chat(engine.tokenizer, [{"role": "user", "content": prompt}])
        else:
            text, ids = prompt, None
        final = write_stream(stream_text(engine, text, ids, params))
    except ValueError as err:
        print(f"latentkv generate: {err}", file=sys.stderr)
        return 2
    sys.stdout.write("\n")
    if final is not None and final.error:
        print(f"latentkv generate: the request failed: {final.error}", file=sys.stderr)
        return 1
    return 0


def fit_history(engine, history: list[dict], max_tokens: int) -> tuple[str, list[int]]:
    """Render the conversation, dropping the oldest turns (never the system message or
    the newest user message) until prompt + max_tokens fits in the context."""
    budget = engine.max_model_len - min(max_tokens, engine.max_model_len // 2)
    while True:
        text, ids = render_chat(engine.tokenizer, history)
        droppable = [i for i, m in enumerate(history[:-1]) if m["role"] != "system"]
        if len(ids) <= budget or not droppable:
            return text, ids
        del history[droppable[0]]


def run_chat(args) -> int:
    """Chat until /exit, Ctrl-D or Ctrl-C at the prompt (Ctrl-C during a reply ends the reply), or
    SIGTERM (exit 143); then close the engine (the KV store's queue written)."""
    engine = None
    timeout = 0.0
    with sigterm_unwinds():
        try:
            engine, params, timeout = load(args, "chat")
            return chat(engine, params, args) if engine is not None else 2
        except Interrupted as err:
            print()
            return exit_status(err)
        finally:
            close(engine, timeout)


def chat(engine, params, args) -> int:
    if engine.tokenizer is None or not getattr(engine.tokenizer, "chat_template", None):
        print("latentkv chat: this model has no chat template", file=sys.stderr)
        return 2
    history = [{"role": "system", "content": args.system}] if args.system else []
    print(CHAT_HELP, file=sys.stderr)
    while True:
        try:
            line = input("you> ").strip()
        except Interrupted:
            raise
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if line in ("/exit", "/quit"):
            return 0
        if line == "/reset":
            history = history[:1] if args.system else []
            continue
        if not line:
            continue
        history.append({"role": "user", "content": line})
        reply = chat_turn(engine, history, params)
        if reply is None:
            history.pop()
        else:
            history.append({"role": "assistant", "content": reply})


def chat_turn(engine, history: list[dict], params) -> str | None:
    """Stream one reply; None when it failed (the message says why)."""
    try:
        text, ids = fit_history(engine, history, params.max_tokens or 256)
        sys.stdout.write("assistant> ")
        final = write_stream(stream_text(engine, text, ids, params))
    except Interrupted:
        raise
    except KeyboardInterrupt:
        print("\n(interrupted)")
        return None
    except ValueError as err:
        print(f"\nlatentkv chat: {err}", file=sys.stderr)
        return None
    print()
    if final is None or final.error:
        print(f"latentkv chat: the reply failed: {final.error if final else 'no output'}", file=sys.stderr)
        return None
    return final.outputs[0].text
