"""The official OpenAI and Anthropic Python SDKs, unchanged but for the base URL, through the
gateway: one JSON line per case with what the SDK saw (id, text, usage, finish reason, events).
Run by tests/sdk.rs; argv[1] is the gateway's base URL (http://127.0.0.1:PORT)."""

import json
import sys

import anthropic
import openai

base = sys.argv[1]
oa = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
an = anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
PROMPT = "say something short"


def out(case, **seen):
    print(json.dumps({"case": case, **seen}), flush=True)


def chat(stream, include_usage):
    kw = {"model": "demo", "max_tokens": 7, "messages": [{"role": "user", "content": PROMPT}]}
    if not stream:
        r = oa.chat.completions.create(**kw)
        u = r.usage
        out("openai.chat", id=r.id, text=r.choices[0].message.content,
            input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens,
            finish=r.choices[0].finish_reason, events=1)
        return
    if include_usage:
        kw["stream_options"] = {"include_usage": True}
    text, finish, usage, events, rid = "", None, None, 0, None
    for chunk in oa.chat.completions.create(stream=True, **kw):
        events += 1
        rid = chunk.id
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    out("openai.chat.stream" + (".usage" if include_usage else ""), id=rid, text=text,
        input_tokens=usage.prompt_tokens if usage else None,
        output_tokens=usage.completion_tokens if usage else None, finish=finish, events=events)


def completions():
    text, finish, rid, events = "", None, None, 0
    for chunk in oa.completions.create(model="demo", prompt=PROMPT, max_tokens=7, stream=True):
        events += 1
        rid = chunk.id
        for c in chunk.choices:
            text += c.text
            finish = c.finish_reason or finish
    out("openai.completions.stream", id=rid, text=text, input_tokens=None, output_tokens=None,
        finish=finish, events=events)


def responses(stream):
    if not stream:
        r = oa.responses.create(model="demo", input=PROMPT, max_output_tokens=7)
        out("openai.responses", id=r.id, text=r.output_text, input_tokens=r.usage.input_tokens,
            output_tokens=r.usage.output_tokens, finish=r.status, events=1)
        return
    text, final, events = "", None, 0
    for ev in oa.responses.create(model="demo", input=PROMPT, max_output_tokens=7, stream=True):
        events += 1
        if ev.type == "response.output_text.delta":
            text += ev.delta
        elif ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    out("openai.responses.stream", id=final.id, text=text,
        input_tokens=final.usage.input_tokens, output_tokens=final.usage.output_tokens,
        finish=final.status, events=events)


def messages(stream):
    kw = {"model": "demo", "max_tokens": 7, "messages": [{"role": "user", "content": PROMPT}]}
    if not stream:
        m = an.messages.create(**kw)
        out("anthropic.messages", id=m.id, text=m.content[0].text,
            input_tokens=m.usage.input_tokens, output_tokens=m.usage.output_tokens,
            finish=m.stop_reason, events=1)
        return
    # The SDK's own stream helper: it rebuilds the message from the events.
    with an.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        m = s.get_final_message()
    out("anthropic.messages.stream", id=m.id, text=text, input_tokens=m.usage.input_tokens,
        output_tokens=m.usage.output_tokens, finish=m.stop_reason, events=None)
    events = sum(1 for _ in an.messages.create(stream=True, **kw))
    out("anthropic.messages.stream.raw", id=None, text=None, input_tokens=None,
        output_tokens=None, finish=None, events=events)


chat(False, False)
chat(True, False)
chat(True, True)
completions()
responses(False)
responses(True)
messages(False)
messages(True)
