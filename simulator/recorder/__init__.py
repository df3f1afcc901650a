"""`agentload record`: a pass-through proxy in front of an OpenAI-compatible server that writes the traffic
flowing through it as a replayable recording (token counts, timing, prefix block ids, tasks; never
content or secrets).

- `proxy`: the proxy (`Recorder`, `RecordSettings`);
- `stream_tap`: what is read from a streamed answer on its way (usage, first token, stop reason);
- `prompt_tokens`: a prompt's token ids (from the request, the upstream's /tokenize, a local tokenizer);
- `block_hash`: prefix block ids of token ids;
- `keys`: a call's session key (header, traceparent, ``user``);
- `grouping`: which task a call belongs to (by key, or inferred from prompts and timing), over
  `prompt_tree`, the live prompts in a radix tree;
- `journal`: the recording file, written line by line (read back by `simulator.traces.recording`).
"""
