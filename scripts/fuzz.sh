#!/usr/bin/env bash
# Fuzzes every parser of outside bytes with libFuzzer + ASan + UBSan, SECONDS (default 15) per
# target:
#   fuzz_gguf     the GGUF reader (model files)
#   fuzz_hf       a Hugging Face directory's files: safetensors shards, config.json -> the model
#                 config, tokenizer.json (+ tokenizer_config.json, generation_config.json) -> the
#                 tokenizer
#   fuzz_request  an HTTP request body -> the validated engine request (JSON, fields, prompts,
#                 chat messages, tokenize/detokenize), over the real SmolLM2 model
#   fuzz_chat     chat messages -> every chat template family -> the tokenizer (content can never
#                 forge a control token; valid UTF-8 survives encode/decode)
#   fuzz_pretok   any bytes -> every BPE pre-tokenizer (the words cover the input exactly)
#   fuzz_jinja    the Jinja interpreter (base/jinja): fuzzed template text over a fixed context, and
#                 the real fixture templates over fuzzed conversations (content stays inside the
#                 content ranges; every limit holds)
#   fuzz_schema   structure-aware JSON Schemas and EBNF grammars ($ref chains and cycles, nesting,
#                 patterns) -> the server's checks -> xgrammar's compiler on a 256 KiB stack
#   fuzz_answer   a model's output -> reasoning, content and tool calls in every format (harmony,
#                 <think>, Hermes, Llama 3.x, Mistral) and tool_choice mode, whole and streamed
#   fuzz_http_head  a request's raw bytes, arriving in pieces -> the head scanner (obs-fold), Beast's
#                 parser, the framing rules (server/http_framing.h) and a chunked body at the limit
#   fuzz_grpc_request  a gRPC GenerateRequest's bytes -> the validated engine request
#                 (server/grpc_request.h: chat, tools, constraints, sampling) over the real SmolLM2
#                 model (the message code generated here with protoc)
# The HTTP parser itself is Boost.Beast's, fuzzed upstream; fuzz_http_head checks fathom's code
# around it, and tests/e2e/test_http_hardening.py attacks the whole over sockets.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (default: every target)
# Builds with clang++ (Debian: clang, libclang-rt-14-dev) into build-fuzz/, exits non-zero on any
# crash, leak, hang or UB. Findings are saved as build-fuzz/<target>-crash-* etc.; replay one with
# build-fuzz/<target> FILE. Each target keeps its corpus in build-fuzz/corpus-<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-15}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(fuzz_gguf fuzz_hf fuzz_request fuzz_chat fuzz_pretok fuzz_jinja fuzz_schema fuzz_answer fuzz_http_head
  fuzz_grpc_request)
out=build-fuzz
cxx=${FUZZ_CXX:-clang++}
# The compiler cache when there is one (the Makefile points it at the shared cache): relative paths
# only, so clean clones reuse each other's objects.
launcher=()
command -v ccache >/dev/null && launcher=(ccache)
# xgrammar (scripts/setup_xgrammar.sh) for fuzz_schema: its headers here, its library at the link.
xgrammar=${FATHOM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fathom}/xgrammar-0.2.8
# fuzz_grpc_request's protobuf message code, generated from the tree's proto (below).
gen=$out/gen
flags=(-std=c++20 -I. -isystem "$gen" -isystem "$xgrammar/src/include" -isystem "$xgrammar/src/3rdparty/dlpack/include"
  -isystem "$xgrammar/src/3rdparty/picojson" -DXGRAMMAR_ENABLE_CPPTRACE=0 -O1 -gline-tables-only -fno-omit-frame-pointer -Wall -Wextra -Werror
  -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined)

pretok_sources=(engine/model/bpe_pretokenizer.cpp engine/model/bpe_pretokenizer_split.cpp engine/model/unicode_chars.cpp)
gguf_sources=(engine/model/gguf.cpp engine/model/gguf_values.cpp engine/model/mapped_file.cpp base/error.cpp kernels/ggml_type.cpp)
hf_sources=("${gguf_sources[@]}" engine/model/hf_dir.cpp engine/model/hf_config.cpp engine/model/hf_gpt_oss.cpp engine/model/hf_json.cpp
  engine/model/hf_tokenizer.cpp engine/model/hf_sentencepiece.cpp engine/model/safetensors.cpp)
model_sources=("${hf_sources[@]}" engine/model/model.cpp engine/model/model_config.cpp engine/model/rope_scaling.cpp engine/model/weights.cpp
  engine/model/tokenizer.cpp engine/model/bpe_tokenizer.cpp "${pretok_sources[@]}" engine/model/unicode_nfc.cpp
  engine/model/sentencepiece_tokenizer.cpp engine/model/sentencepiece_loader.cpp
  engine/model/chat_template.cpp engine/model/chat_families.cpp base/jinja/*.cpp kernels/ref/dequant.cpp)
request_sources=("${model_sources[@]}" server/openai_request.cpp server/chat_input.cpp server/reasoning.cpp server/known_fields.cpp server/prompt_input.cpp
  server/harmony.cpp server/answer.cpp
  server/embeddings.cpp server/attention_options.cpp server/request_rules.cpp server/schema_rules.cpp
  engine/constraint/constraint_bounds.cpp server/tools.cpp server/responses_api.cpp server/openai_response.cpp server/cli_args.cpp engine/attention/policy.cpp engine/speculative/drafter.cpp engine/attention/policy_registry.cpp engine/attention/policies/sparq.cpp
  engine/attention/policies/hip.cpp engine/attention/policies/alisa.cpp engine/attention/policies/auto.cpp
  kernels/ref/sparq.cpp kernels/ref/attention_state.cpp)

jinja_sources=(base/jinja/*.cpp base/error.cpp)

schema_sources=("${model_sources[@]}" engine/constraint/grammar.cpp engine/constraint/constraint_bounds.cpp
  server/schema_rules.cpp)

sources_of() {
  case "$1" in
    fuzz_gguf) echo "${gguf_sources[@]}" ;;
    fuzz_hf) echo "${model_sources[@]}" ;;
    fuzz_request) echo "${request_sources[@]}" ;;
    fuzz_chat) echo "${model_sources[@]}" ;;
    fuzz_pretok) echo "${pretok_sources[@]}" base/error.cpp ;;
    fuzz_jinja) echo "${jinja_sources[@]}" ;;
    fuzz_schema) echo "${schema_sources[@]}" ;;
    fuzz_answer) echo "${request_sources[@]}" server/tool_stream.cpp ;;
    fuzz_http_head) echo server/http_framing.cpp ;;
    fuzz_grpc_request) echo "${request_sources[@]}" server/grpc_request.cpp engine/sampling_params.cpp "$gen/proto/fathom.pb.cc" ;;
    *) echo "fuzz: unknown target $1 (fuzz_gguf, fuzz_hf, fuzz_request, fuzz_chat, fuzz_pretok, fuzz_jinja, fuzz_schema, fuzz_answer, fuzz_http_head, fuzz_grpc_request)" >&2; exit 2 ;;
  esac
}

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz: $cxx not found (install clang and libclang-rt-14-dev: scripts/setup.sh)" >&2
  exit 1
fi

if [[ " ${targets[*]} " == *" fuzz_grpc_request "* ]]; then
  mkdir -p "$gen"
  protoc -I. --cpp_out="$gen" proto/fathom.proto  # proto/fathom.pb.{h,cc}, as the build includes them
fi

# Objects are rebuilt when any source or header of the layers they come from changed (cheap
# to check, and a stale object would fuzz old code).
mkdir -p "$out/obj"
stamp="$out/obj/.stamp"
if [ ! -f "$stamp" ] || [ -n "$(find base engine kernels server proto tests/fuzz scripts/fuzz.sh \
  \( -name '*.cpp' -o -name '*.h' -o -name '*.inc' -o -name '*.sh' \) -newer "$stamp" -print -quit)" ]; then
  rm -f "$out"/obj/*.o
fi
all=()
for t in "${targets[@]}"; do
  read -ra srcs <<<"$(sources_of "$t")"
  all+=("${srcs[@]}" "tests/fuzz/$t.cpp")
done
mapfile -t unique < <(printf '%s\n' "${all[@]}" | sort -u)
todo=()
for src in "${unique[@]}"; do
  obj="$out/obj/${src//\//_}.o"
  [ -f "$obj" ] || todo+=("$src")
done
if ((${#todo[@]})); then
  echo "fuzz: compiling ${#todo[@]} sources with $cxx + ASan/UBSan"
  printf '%s\n' "${todo[@]}" | xargs -P "$(nproc)" -I{} sh -c \
    'src="$1"; shift; obj="'"$out"'/obj/$(echo "$src" | tr / _).o"; "$@" -c "$src" -o "$obj"' _ {} "${launcher[@]}" "$cxx" "${flags[@]}"
fi
touch "$stamp"

for t in "${targets[@]}"; do
  read -ra srcs <<<"$(sources_of "$t")"
  objs=()
  for src in "${srcs[@]}" "tests/fuzz/$t.cpp"; do objs+=("$out/obj/${src//\//_}.o"); done
  libs=(-ldl)
  [ "$t" = fuzz_schema ] && libs=("$xgrammar/build/libxgrammar.a" -lpthread -ldl)
  [ "$t" = fuzz_grpc_request ] && libs=(-lprotobuf -lpthread -ldl)
  "$cxx" -fsanitize=fuzzer,address,undefined "${objs[@]}" "${libs[@]}" -o "$out/$t"
done

# Seed corpora are regenerated every run (cheap); corpus-<target>/ keeps what the fuzzer learned.
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import gguf' 2>/dev/null; then
  .venv/bin/python tests/fuzz/make_corpus.py "$out" models/*.gguf
else
  echo "fuzz: .venv with the gguf package missing (run scripts/setup.sh); fuzzing without seeds" >&2
fi

# fuzz_jinja's seeds: each fixture template as template text (mode byte 0) and as a conversation
# for that template (mode 1).
if [[ " ${targets[*]} " == *" fuzz_jinja "* ]]; then
  mkdir -p "$out/seeds-fuzz_jinja"
  i=0
  for f in tests/fixtures/chat_templates/*.jinja; do
    { printf '\0'; cat "$f"; } > "$out/seeds-fuzz_jinja/template-$i"
    printf '\001%b\001hello <|im_start|>\036\002hi\036\006call' "\\$(printf '%03o' $((i % 256)))" > "$out/seeds-fuzz_jinja/chat-$i"
    i=$((i + 1))
  done
fi

# fuzz_answer's seeds: answers in each format ([selector][cut seed][text]).
if [[ " ${targets[*]} " == *" fuzz_answer "* ]]; then
  mkdir -p "$out/seeds-fuzz_answer"
  printf '\007\003<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}' \
    > "$out/seeds-fuzz_answer/harmony-call"
  printf '\003\005<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>' > "$out/seeds-fuzz_answer/harmony-final"
  printf '\004\011<think>a</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>' > "$out/seeds-fuzz_answer/hermes"
  printf '\005\002<|python_tag|>{"name": "f", "parameters": {}}' > "$out/seeds-fuzz_answer/llama"
  printf '\006\007Ok.[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{}' > "$out/seeds-fuzz_answer/mistral"
fi

# fuzz_http_head's seeds: requests as clients send them ([piece size][bytes]).
if [[ " ${targets[*]} " == *" fuzz_http_head "* ]]; then
  mkdir -p "$out/seeds-fuzz_http_head"
  printf '\000GET /health HTTP/1.1\r\nHost: x\r\n\r\n' > "$out/seeds-fuzz_http_head/get"
  printf '\003POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nX-Request-Id: a.b_c-1\r\n\r\n{}' \
    > "$out/seeds-fuzz_http_head/post"
  printf '\001POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nT: 1\r\n\r\n' \
    > "$out/seeds-fuzz_http_head/chunked"
  printf '\017POST / HTTP/1.0\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n x\r\n\r\n' \
    > "$out/seeds-fuzz_http_head/refused"
fi

# fuzz_grpc_request's seeds: GenerateRequests as clients send them ([selector][message]), written with
# protoc's Python output of the tree's proto.
if [[ " ${targets[*]} " == *" fuzz_grpc_request "* ]] && [ -x .venv/bin/python ]; then
  mkdir -p "$out/seeds-fuzz_grpc_request" "$out/proto_py"
  .venv/bin/python -m grpc_tools.protoc -Iproto --python_out="$out/proto_py" proto/fathom.proto
  PYTHONPATH="$out/proto_py" .venv/bin/python - "$out/seeds-fuzz_grpc_request" <<'PY'
import sys, fathom_pb2 as m
out = sys.argv[1]
tool = m.FunctionTool(name="get_weather", description="Weather", strict=True,
                      parameters='{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}')
seeds = {
    "text": (0, m.GenerateRequest(text="The capital of France is", max_tokens=8, stop=["."], n=2, priority=3)),
    "ids": (0, m.GenerateRequest(token_ids=m.TokenIds(ids=[1, 2, 3]), attention="sparq", kv_read_ratio=0.25)),
    "chat-tools": (1, m.GenerateRequest(chat=m.ChatMessages(messages=[
        m.ChatMessage(role="user", content="Weather in Paris?"),
        m.ChatMessage(role="assistant", tool_calls=[m.ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}')]),
        m.ChatMessage(role="tool", content="21 C", tool_call_id="c1")]), tools=[tool], tool_choice="get_weather")),
    "schema": (0, m.GenerateRequest(chat=m.ChatMessages(messages=[m.ChatMessage(role="user", content="hi")]),
                                    constraint=m.OutputConstraint(json_schema='{"type": "object"}', strict=True),
                                    sampling=m.SamplingParameters(temperature=0.5, top_k=5, logit_bias={3: 1.5}, logprobs=2))),
    "grammar": (0, m.GenerateRequest(text="x", constraint=m.OutputConstraint(grammar='root ::= "a" [b-z]*'),
                                     speculative="ngram", ignore_eos=True)),
}
for name, (sel, req) in seeds.items():
    open(f"{out}/{name}", "wb").write(bytes([sel]) + req.SerializeToString())
PY
fi

# fuzz_hf's seeds: each fixture directory's config.json (mode byte 1), tokenizer.json (2),
# tokenizer_config.json + NUL + generation_config.json (3), and a shard's header with its data cut to
# 64 bytes (0: the header's offsets then point past the end, which the parser must refuse).
if [[ " ${targets[*]} " == *" fuzz_hf "* ]]; then
  mkdir -p "$out/seeds-fuzz_hf"
  for d in tests/fixtures/arch/*-hf; do
    n=$(basename "$d")
    { printf '\001'; cat "$d/config.json"; } > "$out/seeds-fuzz_hf/config-$n"
    { printf '\002'; cat "$d/tokenizer.json"; } > "$out/seeds-fuzz_hf/tokenizer-$n"
    { printf '\003'; cat "$d/tokenizer_config.json"; printf '\0'; cat "$d/generation_config.json"; } \
      > "$out/seeds-fuzz_hf/tokenizer-config-$n"
    header=$(od -An -tu8 -N8 "$d/model.safetensors" | tr -d ' ')
    { printf '\000'; head -c $((8 + header + 64)) "$d/model.safetensors"; } > "$out/seeds-fuzz_hf/shard-$n"
  done
  # The SentencePiece-style fixtures without their post-processor (whose BOS this mode cannot name).
  for d in tests/fixtures/sp_tokenizers/*/; do
    python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); j["post_processor"] = None
sys.stdout.write("\002" + json.dumps(j))' "$d/tokenizer.json" > "$out/seeds-fuzz_hf/tokenizer-sp-$(basename "$d")"
  done
  # gpt-oss's fused experts as fuzz_hf lays them out (2 layers, 2 experts of 32, hidden 32): layer 0
  # MXFP4 gate/up and bf16 down, layer 1 the reverse, with their biases.
  python3 - "$out/seeds-fuzz_hf/shard-gpt-oss-experts" <<'PY'
import json, struct, sys
e, i, h = 2, 32, 32
shapes = {"0.mlp.experts.gate_up_proj_blocks": ("U8", [e, 2 * i, h // 32, 16]),
          "0.mlp.experts.gate_up_proj_scales": ("U8", [e, 2 * i, h // 32]),
          "0.mlp.experts.gate_up_proj_bias": ("BF16", [e, 2 * i]),
          "0.mlp.experts.down_proj": ("BF16", [e, i, h]), "0.mlp.experts.down_proj_bias": ("BF16", [e, h]),
          "1.mlp.experts.gate_up_proj": ("BF16", [e, h, 2 * i]),
          "1.mlp.experts.down_proj_blocks": ("U8", [e, h, i // 32, 16]),
          "1.mlp.experts.down_proj_scales": ("U8", [e, h, i // 32])}
header, data = {}, b""
for name, (dtype, shape) in shapes.items():
    n = (2 if dtype == "BF16" else 1) * eval("*".join(map(str, shape)))
    header["model.layers." + name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
    data += bytes((k * 37 + len(data)) % 256 for k in range(n))
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[1], "wb").write(b"\0" + struct.pack("<Q", len(text)) + text + data)
PY
  # A whole valid shard: one F32 tensor of 2 elements (a 56-byte header, space-padded).
  printf '\000\070\0\0\0\0\0\0\0{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}  12345678' \
    > "$out/seeds-fuzz_hf/shard-valid"
fi

# One target per core at a time (each libFuzzer process is single-threaded).
fuzz_one() {
  local t=$1 dict=()
  mkdir -p "$out/corpus-$t" "$out/seeds-$t"
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: 2 GiB is far above what a
  # 64 KiB input may legitimately need (the model mapping is shared, not counted per input).
  if ! "$out/$t" "$out/corpus-$t" "$out/seeds-$t" "${dict[@]}" -max_total_time="$seconds" -max_len=65536 \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$out/$t-" 2> "$out/$t.log"; then
    tail -n 60 "$out/$t.log" >&2
    echo "fuzz: $t FAILED; the input is saved as $out/$t-crash-*/leak-*/timeout-*; log: $out/$t.log" >&2
    return 1
  fi
  echo "fuzz: $t for ${seconds}s: $(grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$out/$t.log" | tr '\n' ' ')"
}
pids=() failed=0
for t in "${targets[@]}"; do
  if ((${#pids[@]} >= $(nproc))); then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
  fuzz_one "$t" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
((failed == 0)) || exit 1
echo "fuzz: OK, no findings (${targets[*]}, ${seconds}s each)"
