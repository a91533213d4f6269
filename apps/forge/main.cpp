// forge: one program for the life of a language model. Dispatches to cmd_<name>.cpp; turns a
// forge::Error (the user's problem) into one line on stderr and exit code 1.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>

#include "commands.h"
#include "forge/core/error.h"

namespace {

struct Entry {
  const char* name;
  int (*fn)(const forge::cli::Argv&);
  const char* summary;  // for an alias: "alias of <command>"
  // What to make smaller when the command runs out of host memory (std::bad_alloc).
  const char* oom_hint = "a smaller model or input";
};

const Entry kCommands[] = {
    {"quickstart", forge::cli::cmd_quickstart,
     "train a tiny model on a real corpus, then sample from it"},
    {"train", forge::cli::cmd_train, "pretrain a model on token shards",
     "a smaller batch_size (grad_accum keeps the tokens a step), seq_len, recompute=full or a smaller model"},
    {"eval", forge::cli::cmd_eval, "mean cross-entropy of a model on token shards", "a smaller --batch or --seq-len"},
    {"generate", forge::cli::cmd_generate, "generate text or ids from a model (KV cache, CPU or CUDA)",
     "a smaller --max-batch (the KV cache holds one context per request decoded together)"},
    // The sibling product's name for it (seeds/001: `posttrainllm sample`).
    {"sample", forge::cli::cmd_generate, "alias of generate",
     "a smaller --max-batch (the KV cache holds one context per request decoded together)"},
    {"serve", forge::cli::cmd_serve, "serve a model over an OpenAI-compatible HTTP API",
     "a smaller --max-batch or --context (the KV cache holds max-batch x context tokens)"},
    {"tokenizer", forge::cli::cmd_tokenizer, "train a BPE tokenizer; encode and decode text"},
    {"data", forge::cli::cmd_data, "tokenize text documents into train/val token shards"},
    {"chat-template", forge::cli::cmd_chat_template,
     "render a model's chat template for a conversation (and its tokens)"},
    {"bench", forge::cli::cmd_bench, "benchmarks: tokenizer, gemm, attention, train, generate, serve",
     "smaller sizes (--batch, --batches, --seq-len, a smaller --preset)"},
    {"merge", forge::cli::cmd_merge, "fold a LoRA adapter into its base model (forge train --lora)"},
    {"inspect", forge::cli::cmd_inspect,
     "show a model directory: config, parameter count, tensors"},
    {"validate", forge::cli::cmd_validate,
     "check a model directory: load, save, reload, compare, checksum"},
};

void usage() {
  std::printf("forge — train and run transformer language models\n\nusage: forge <command> [options]\n\ncommands:\n");
  for (const auto& c : kCommands) std::printf("  %-12s %s\n", c.name, c.summary);
  std::printf("\n`forge <command> --help` describes a command.\n");
}

}  // namespace

// libgomp's idle threads spin by default, which on our 2-vCPU machines steals the core that the
// serial parts of a step (and OpenBLAS) need: the tiny preset trains at ~1,000 tokens/s with
// spinning and ~3,200 with passive waiting (measured on the CI machine kind). libgomp reads its
// settings when it loads, before main, so we set the variable and re-execute once. A user's own
// OMP_WAIT_POLICY is left alone.
void prefer_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: carry on with spinning threads
}

int main(int argc, char** argv) {
  prefer_passive_openmp(argv);
  // A write past a file-size limit (ulimit -f) raises SIGXFSZ, which kills the process, a
  // checkpoint half-written in its temporary directory. Ignored, the write fails with EFBIG
  // instead and the save ends as any failed save does: a one-line error naming the file.
  std::signal(SIGXFSZ, SIG_IGN);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    usage();
    return argc < 2 ? 1 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::printf("forge 0.1.0\n");
    return 0;
  }
  const forge::cli::Argv rest(argv + 2, argv + argc);
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    try {
      return c.fn(rest);
    } catch (const forge::Error& e) {
      std::fprintf(stderr, "forge %s: error: %s\n", c.name, e.what());
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "forge %s: error: out of host memory (try %s)\n", c.name, c.oom_hint);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "forge %s: error: %s\n", c.name, e.what());
    }
    return 1;
  }
  std::fprintf(stderr, "forge: unknown command '%s' (see forge --help)\n", argv[1]);
  return 1;
}
