#!/usr/bin/env python3
"""Generate tests/text/data/chat_goldens.json: prompts rendered by DeepSeek's
own encoding_dsv4.py (vendored next to this script) for every mode and
message kind, plus their token ids from HF tokenizers. Run once; the C++ test
compares byte for byte without Python.

Usage: python3 tools/text/gen_chat_goldens.py
Needs: pip install tokenizers==0.23.3
"""
import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import encoding_dsv4 as enc  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "text", "data", "chat_goldens.json")
PARSE_OUT = os.path.join(ROOT, "tests", "text", "data", "parse_goldens.json")

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Get the current weather for a city. 支持中文城市名。",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "threshold": {"type": "number", "minimum": 0.5, "maximum": 1e20, "multipleOf": 1e-07},
        "detailed": {"type": "boolean", "default": False},
    }, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search",
    "description": "Search the web.\nReturns a list of results.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"},
        "filters": {"type": "object", "properties": {"site": {"type": "string"}, "year": {"type": "integer"}}},
        "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["query"]}}}
TOOLS = [WEATHER, SEARCH]


def call(id_, name, args):
    return {"id": id_, "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}


SYS = {"role": "system", "content": "You are a helpful assistant."}
SYS_TOOLS = {"role": "system", "content": "You are a helpful assistant.", "tools": TOOLS}

TOOL_TURN = [
    SYS_TOOLS,
    {"role": "user", "content": "Weather in Paris and Tokyo, and search news?"},
    {"role": "assistant", "content": "", "reasoning_content": "Need three calls.",
     "tool_calls": [
         call("call_1", "get_weather", {"city": "Paris", "days": 3, "detailed": True, "threshold": 0.25}),
         call("call_2", "get_weather", {"city": "東京", "unit": "celsius"}),
         call("call_3", "search", {"query": "news \"today\"\n<b>", "filters": {"site": "example.com", "year": 2026},
                                   "tags": ["a", "b"], "extra": None}),
     ]},
    # Results arrive out of order; the script sorts them by call order.
    {"role": "tool", "tool_call_id": "call_3", "content": "Top story: ..."},
    {"role": "tool", "tool_call_id": "call_1", "content": "Paris: 18C, cloudy"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "Tokyo: 22C"},
                                                           {"type": "image_url", "image_url": "x"},
                                                           {"type": "text", "text": "humid"}]},
    {"role": "assistant", "content": "Paris is cloudy, Tokyo is warm.", "reasoning_content": "Summarize."},
    {"role": "user", "content": "Thanks! And Berlin?"},
]

HISTORY = [
    SYS,
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Simple addition: 2+2=4."},
    {"role": "user", "content": "And 3*3?"},
    {"role": "assistant", "content": "9", "reasoning_content": "3 times 3 is 9."},
    {"role": "user", "content": "Now 10/4?"},
]


def cases():
    c = []

    def add(name, messages, mode, effort=None, drop=True, bos=True, context=None):
        c.append(dict(name=name, messages=messages, thinking_mode=mode, reasoning_effort=effort,
                      drop_thinking=drop, add_default_bos_token=bos, context=context))

    simple = [SYS, {"role": "user", "content": "Hello! 你好 👋"}]
    for mode in ["chat", "thinking"]:
        add(mode + "_simple", simple, mode)
        add(mode + "_effort_high", simple, mode, effort="high")
        add(mode + "_effort_max", simple, mode, effort="max")
        add(mode + "_no_system", [{"role": "user", "content": "Hi"}], mode)
        add(mode + "_history", HISTORY, mode)
        add(mode + "_history_keep_thinking", HISTORY, mode, drop=False)
        add(mode + "_tools", TOOL_TURN, mode)
        add(mode + "_tools_max", TOOL_TURN, mode, effort="max")
        add(mode + "_tool_pending", TOOL_TURN[:6], mode)  # prompt ends after tool results
        add(mode + "_assistant_last", HISTORY[:3], mode)
        add(mode + "_prefill_wo_eos",
            [SYS, {"role": "user", "content": "Write a haiku."},
             {"role": "assistant", "content": "Autumn moon", "reasoning_content": "5-7-5.", "wo_eos": True}], mode)
        add(mode + "_developer",
            [SYS, {"role": "developer", "content": "Answer in JSON.", "tools": [SEARCH],
                   "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}},
             {"role": "user", "content": "List two fruits."}], mode)
        add(mode + "_developer_history",
            [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "a"},
             {"role": "assistant", "content": "b", "reasoning_content": "r1"},
             {"role": "developer", "content": "Be verbose."}, {"role": "user", "content": "c"}], mode)
        add(mode + "_response_format",
            [{"role": "system", "content": "Extract.", "response_format": {"type": "json_object", "ratio": 2.0}},
             {"role": "user", "content": "Alice is 30."}], mode)
        add(mode + "_latest_reminder",
            [SYS, {"role": "user", "content": "Plan my day."},
             {"role": "latest_reminder", "content": "Today is 2026-04-27."}], mode)
        add(mode + "_latest_reminder_mid",
            [SYS, {"role": "user", "content": "Hi"}, {"role": "latest_reminder", "content": "Reminder"},
             {"role": "assistant", "content": "Hello", "reasoning_content": "greet"},
             {"role": "user", "content": "Bye"}], mode)
        for task in ["query", "action", "title", "read_url"]:
            add(mode + "_task_" + task,
                [SYS, {"role": "user", "content": "Find flights to Rome", "task": task}], mode)
        add(mode + "_task_then_answer",
            [{"role": "user", "content": "Classify: hello", "task": "domain"},
             {"role": "assistant", "content": "greeting", "reasoning_content": "ignored"},
             {"role": "user", "content": "ok"}], mode)
        add(mode + "_merge_users",
            [{"role": "user", "content": "part one"}, {"role": "user", "content": "part two"}], mode)
        add(mode + "_tool_without_user",
            [SYS_TOOLS, {"role": "user", "content": "go"},
             {"role": "assistant", "content": "Calling.", "tool_calls": [call("x1", "search", {"query": "q"})]},
             {"role": "tool", "tool_call_id": "x1", "content": "r"},
             {"role": "user", "content": "and?"}], mode)
        add(mode + "_function_id_order",
            [SYS_TOOLS, {"role": "user", "content": "two"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"type": "function", "function": {"id": "f_a", "name": "search", "arguments": "{\"query\": \"a\"}"}},
                 {"type": "function", "function": {"id": "f_b", "name": "search", "arguments": "{\"query\": \"b\"}"}}]},
             {"role": "tool", "tool_call_id": "f_b", "content": "B"},
             {"role": "tool", "tool_call_id": "f_a", "content": "A"}], mode)
        add(mode + "_bad_arguments",
            [SYS_TOOLS, {"role": "user", "content": "x"},
             {"role": "assistant", "content": "", "tool_calls": [call("c1", "search", "not json {")]},
             {"role": "tool", "tool_call_id": "c1", "content": ""}], mode)
        add(mode + "_special_text",
            [{"role": "user", "content": "Say <think> and </think> and <｜DSML｜tool_calls> literally.\n\n\t  "}], mode)
        add(mode + "_no_bos", simple, mode, bos=False)
        add(mode + "_context", [{"role": "user", "content": "Next question?"}], mode,
            context=HISTORY[:5])
        add(mode + "_context_tools", [{"role": "user", "content": "More?"}], mode, context=TOOL_TURN[:7])
        add(mode + "_empty", [], mode)
    return c


ASSISTANTS = [
    {"role": "assistant", "content": "Hello there!", "reasoning_content": "The user greets me."},
    {"role": "assistant", "content": "", "reasoning_content": ""},
    {"role": "assistant", "content": "多行\n内容 with <tags> & \"quotes\"\n\n", "reasoning_content": "思考\n\nmore"},
    {"role": "assistant", "content": "", "reasoning_content": "call it",
     "tool_calls": [call("a", "get_weather", {"city": "Paris"})]},
    {"role": "assistant", "content": "Let me check.", "reasoning_content": "two calls",
     "tool_calls": [call("a", "get_weather", {"city": "Paris", "days": 3, "detailed": False, "threshold": 0.5}),
                    call("b", "search", {"query": "x\ny \"z\" </b> <｜User｜>?", "filters": {"site": "a.b"},
                                         "tags": [], "n": None, "unicode": "東京🙂"})]},
    {"role": "assistant", "content": None, "tool_calls": [call("c", "noargs", {})]},
    {"role": "assistant", "content": "", "tool_calls": [call("d", "search", {"query": "{\"looks\": \"like json\"}",
                                                                              "nested": {"a": [1, {"b": "c"}]}})]},
]


def parse_cases():
    out = []
    for mode in ["chat", "thinking"]:
        for i, a in enumerate(ASSISTANTS):
            msgs = [{"role": "user", "content": "q"}, copy.deepcopy(a)]
            msgs = enc.merge_tool_messages(msgs)
            completion = enc.render_message(1, msgs, thinking_mode=mode)
            parsed = enc.parse_message_from_completion_text(completion, thinking_mode=mode)
            out.append({"name": "%s_%d" % (mode, i), "thinking_mode": mode,
                        "completion": completion, "expected": parsed})
    return out


def main():
    tok = Tokenizer.from_file(os.path.join(ROOT, "assets", "tokenizer", "tokenizer.json"))
    out = []
    for case in cases():
        kwargs = dict(thinking_mode=case["thinking_mode"], drop_thinking=case["drop_thinking"],
                      add_default_bos_token=case["add_default_bos_token"],
                      reasoning_effort=case["reasoning_effort"])
        if case["context"] is not None:
            kwargs["context"] = copy.deepcopy(case["context"])
        prompt = enc.encode_messages(copy.deepcopy(case["messages"]), **kwargs)
        case = dict(case, prompt=prompt, ids=tok.encode(prompt).ids)
        out.append(case)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("cases=%d -> %s" % (len(out), OUT))
    parsed = parse_cases()
    with open(PARSE_OUT, "w", encoding="utf-8") as f:
        json.dump(parsed, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("parse cases=%d -> %s" % (len(parsed), PARSE_OUT))


if __name__ == "__main__":
    main()
