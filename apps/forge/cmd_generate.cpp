// forge generate (alias: forge sample): text or ids from a model directory, on the CPU or the
// GPU, through the KV-cache engine (generate/engine.h). One prompt streams its text to stdout
// as it is produced; --input runs a whole prompts.jsonl as one batch and prints one JSON line
// per request, in the file's order.
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "forge/core/dtype.h"
#include "forge/core/error.h"
#include "forge/core/log.h"
#include "forge/data/corpus.h"
#include "forge/generate/engine.h"
#include "forge/generate/generation_config.h"
#include "forge/model/lora_dir.h"
#include "forge/chat/chat_encode.h"
#include "forge/chat/chat_template.h"
#include "forge/chat/sft_example.h"
#include "forge/generate/prompts.h"
#include "forge/generate/sampling_settings.h"
#include "forge/generate/text_prompt.h"
#include "forge/generate/text_stream.h"
#include "forge/model/model_dir.h"
#include "forge/tokenizer/tokenizer.h"

namespace forge::cli {

namespace {

const Command kGenerate = {
    "generate",
    "generate text (or ids) from a model, one prompt or a batch",
    {{"model", "DIR", "model directory"},
     {"adapter", "DIR", "a LoRA adapter (forge train --lora's RUNDIR/model) merged into the weights in memory"},
     {"prompt", "TEXT", "prompt text (encoded with the model directory's tokenizer.json)"},
     {"ids", "1,2,3", "prompt token ids"},
     {"input", "FILE", "prompts.jsonl: one request per line, generated as one batch"},
     {"max-new-tokens", "N", "tokens to generate per request (default 64)"},
     {"temperature", "T", "0 = greedy (default 1.0)"},
     {"top-k", "K", "keep the K most likely tokens (default 0 = all)"},
     {"top-p", "P", "nucleus sampling threshold in (0, 1] (default 1 = off)"},
     {"min-p", "P", "drop tokens below P times the most likely one's probability (default 0 = off)"},
     {"repetition-penalty", "R", "divide seen tokens' positive logits by R, multiply negative ones (default 1)"},
     {"seed", "S", "sampling seed, 0 to 2^64-1 (default 0)"},
     {"stop", "STR", "stop before this text (several allowed)", true},
     {"ignore-eos", "", "do not stop at generation_config.json's end-of-sequence ids (nor, --chat, the turn's end)"},
     {"parse-special", "", "read special-token strings in prompt text (<|endoftext|>) as their ids"},
     {"chat", "", "send prompt text as a user turn through the model's chat template"},
     {"device", "D", "cpu (default) or cuda"},
     {"precision", "P", "CUDA compute dtype: bf16 (default), fp16 or fp32"},
     {"max-batch", "N", "requests decoded together with --input (default 32)"},
     {"no-graph", "", "CUDA: launch each decode step's kernels one by one"},
     {"stats", "", "print time to first token and tokens/s to stderr"},
     {"json", "", "print one JSON object per request (ids, text, finish_reason)"}},
    false,
    "",
    "Sampling settings come from, highest first: the flags, a prompts.jsonl line, the model's\n"
    "generation_config.json, then the defaults above. At temperature 0 the most likely token is\n"
    "taken (greedy). Generation stops at an end-of-sequence id of generation_config.json (not\n"
    "printed), at a --stop string (not printed), after --max-new-tokens, or when the sequence\n"
    "fills the model's context (max_seq_len; a note says so). A prompt longer than the context\n"
    "is refused. Prompt text is encoded as `forge data prepare` encodes documents (a literal\n"
    "<|endoftext|> is text; --parse-special reads it as the special id), then gets the special\n"
    "tokens the tokenizer's post-processor adds (BOS). With --chat, each prompt text is a user\n"
    "message rendered by the model's chat template (built-in ChatML without one) with the\n"
    "assistant's turn opened; special tokens come only from the template (the prompt's are\n"
    "text), and generation also stops at the end of the assistant's turn (<|im_end|>, ...)."};

// The flags' sampling settings (only those given).
SamplingOverrides flag_overrides(const Args& a) {
  SamplingOverrides s;
  const Interval any{};  // the ranges are check_sampling's
  if (a.has("temperature")) s.temperature = a.get_double("temperature", 1.0, any);
  if (a.has("top-k")) s.top_k = a.get_int64("top-k", 0, std::numeric_limits<int64_t>::min(),
                                             std::numeric_limits<int64_t>::max());
  if (a.has("top-p")) s.top_p = a.get_double("top-p", 1.0, any);
  if (a.has("min-p")) s.min_p = a.get_double("min-p", 0.0, any);
  if (a.has("repetition-penalty")) s.repetition_penalty = a.get_double("repetition-penalty", 1.0, any);
  if (a.has("max-new-tokens"))
    s.max_new_tokens = a.get_int64("max-new-tokens", 64, std::numeric_limits<int64_t>::min(),
                                   std::numeric_limits<int64_t>::max());
  if (a.has("seed")) s.seed = a.get_uint64("seed", 0);
  check_sampling(s, SettingNames::kFlags);
  return s;
}

struct Job {
  std::vector<GenRequest> reqs;
  std::vector<std::vector<std::string>> stops;  // per request
  std::vector<int> lines;                        // prompts.jsonl line per request (0: flags)
};

}  // namespace

int cmd_generate(const Argv& argv) {
  const Args a = parse_args(kGenerate, argv);
  if (a.help()) {
    print_help(kGenerate);
    return 0;
  }
  const int sources = a.has("prompt") + a.has("ids") + a.has("input");
  if (sources != 1) throw Error("give exactly one of --prompt TEXT, --ids 1,2,3 and --input prompts.jsonl");
  const Device device = parse_device(a.get("device", "cpu"));
  const SamplingOverrides flags = flag_overrides(a);
  const std::string dir = a.require("model");
  Transformer<float> loaded = load_model_dir(dir, GradBuffers::kNone);
  if (a.has("adapter")) {  // as forge merge folds it; tokenizer and settings stay --model's
    const LoadedAdapter adapter = load_adapter_dir(a.get("adapter"), loaded.config());
    merge_lora(loaded.table(), loaded.weights(), AdapterTable(loaded.config(), adapter.lora), adapter.weights);
  }
  const ModelConfig cfg = loaded.config();
  const GenerationConfig gen_cfg = load_generation_config(dir);
  std::optional<tok::Tokenizer> tokenizer;
  if (std::filesystem::exists(dir + "/tokenizer.json")) tokenizer = tok::Tokenizer::load(dir + "/tokenizer.json");
  std::optional<chat::ChatTemplate> chat_template;
  std::string turn_end;  // --chat: where the assistant's turn ends (a stop string or special id)
  if (a.has("chat")) {
    if (!tokenizer) throw Error(str(dir, ": no tokenizer.json, so --chat cannot encode a conversation"));
    if (a.has("parse-special")) throw Error("--chat takes special tokens from the chat template only; drop --parse-special");
    if (a.has("ids")) throw Error("--chat applies the chat template to prompt text; give --prompt or --input");
    chat_template = chat::ChatTemplate::load(dir);
    turn_end = chat::assistant_turn_end(*chat_template);
  }
  auto encode_prompt = [&](const std::string& text, const std::string& where) {
    if (!tokenizer) throw Error(str(where, dir, ": no tokenizer.json, so a text prompt cannot be encoded; give ids"));
    if (chat_template) {
      chat::RenderOptions ro;
      ro.add_generation_prompt = true;
      return chat::encode_chat(*chat_template, *tokenizer, {{"user", text}}, ro,
                               where.empty() ? "--prompt" : where.substr(0, where.size() - 2))
          .ids;
    }
    return encode_text_prompt(*tokenizer, text, a.has("parse-special"), where);
  };

  // Defaults, then generation_config.json, then a prompts.jsonl line, then the flags.
  SamplingOverrides defaults;
  defaults.temperature = 1.0;
  defaults.max_new_tokens = 64;
  const SamplingOverrides base = gen_cfg.sampling_defaults().over(defaults);
  Job job;
  auto add = [&](std::vector<int32_t> ids, const SamplingOverrides& s, std::vector<std::string> stop, int line) {
    const SamplingOverrides eff = flags.over(s.over(base));
    GenRequest r;
    r.prompt = std::move(ids);
    r.max_new_tokens = static_cast<int>(*eff.max_new_tokens);
    r.sampling = apply_sampling(eff);
    if (!a.has("ignore-eos")) r.stop_ids = gen_cfg.eos_token_ids;
    if (!turn_end.empty() && !a.has("ignore-eos")) add_turn_end(*tokenizer, turn_end, r.stop_ids, stop);
    const std::string where = line ? str(a.get("input"), ":", line, ": ") : std::string();
    for (int32_t id : r.prompt)
      if (id < 0 || id >= cfg.vocab_size)
        throw Error(str(where, "token id ", id, " is out of range for vocabulary size ", cfg.vocab_size));
    if (static_cast<int>(r.prompt.size()) > cfg.max_seq_len)
      throw Error(str(where, "a prompt of ", r.prompt.size(), " tokens does not fit the model's context of ",
                      cfg.max_seq_len, " tokens (max_seq_len); shorten it"));
    for (const std::string& x : a.all("stop")) stop.push_back(x);
    job.reqs.push_back(std::move(r));
    job.stops.push_back(std::move(stop));
    job.lines.push_back(line);
  };
  if (a.has("input")) {
    for (const PromptRequest& p : read_prompts(a.get("input"), cfg.vocab_size)) {
      const std::string where = str(a.get("input"), ":", p.line, ": ");
      add(p.prompt ? encode_prompt(*p.prompt, where) : p.ids, p.sampling, p.stop, p.line);
    }
  } else if (a.has("prompt")) {
    add(encode_prompt(a.get("prompt"), ""), {}, {}, 0);
  } else {
    const std::vector<int> ids = parse_id_list(a.get("ids"));
    add(std::vector<int32_t>(ids.begin(), ids.end()), {}, {}, 0);
  }

  std::unique_ptr<Engine> engine = make_engine(std::move(loaded), device, a.get("precision", "bf16"));
  GenOptions go;
  go.max_batch = a.get_int("max-batch", 32, 1, 4096);
  go.graph = !a.has("no-graph");

  const bool json = a.has("json"), batch = a.has("input");
  const bool stream_text = tokenizer && !json && !batch;
  std::vector<TextStream> streams;
  for (const auto& stop : job.stops) {
    if (tokenizer) streams.emplace_back(*tokenizer, stop, /*skip_special=*/true);
    else if (!stop.empty()) throw Error(str(dir, ": no tokenizer.json, so --stop strings cannot be matched"));
  }
  auto on_token = [&](int r, int32_t id) {
    if (streams.empty()) return true;
    const std::string text = streams[r].push(id);
    if (stream_text && !text.empty()) {
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    }
    return !streams[r].stopped();
  };
  GenStats stats;
  const std::vector<GenResult> res = engine->generate(job.reqs, go, on_token, &stats);

  for (size_t r = 0; r < res.size(); ++r) {
    std::string text;
    if (!streams.empty()) {
      const std::string rest = streams[r].finish();
      if (stream_text) std::fputs(rest.c_str(), stdout);
      text = streams[r].text();
    }
    if (res[r].reason == FinishReason::kContext)
      log_info(str(batch ? str(a.get("input"), ":", job.lines[r], ": ") : "", "note: stopped at the model's context of ",
                   engine->config().max_seq_len, " tokens"));
    if (json || batch) {
      nlohmann::json j = {{"ids", res[r].ids}, {"finish_reason", finish_reason_name(res[r].reason)}};
      if (batch) j["line"] = job.lines[r];
      if (tokenizer) j["text"] = text;
      std::printf("%s\n", j.dump().c_str());
    } else if (tokenizer) {
      std::printf("\n");
    } else {
      for (size_t i = 0; i < res[r].ids.size(); ++i) std::printf("%s%d", i ? "," : "", res[r].ids[i]);
      std::printf("\n");
    }
  }
  if (a.has("stats"))
    std::fprintf(stderr, "%s: %lld tokens in %.3f s of decoding (%.1f tokens/s), first token after %.1f ms\n",
                 engine->device_name().c_str(), static_cast<long long>(stats.decode_tokens + res.size()),
                 stats.decode_s, stats.decode_s > 0 ? stats.decode_tokens / stats.decode_s : 0.0,
                 stats.first_token_s * 1e3);
  return 0;
}

}  // namespace forge::cli
