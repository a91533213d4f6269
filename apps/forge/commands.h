// One function per subcommand, each in its own cmd_<name>.cpp: parse → call the library → print.
#pragma once

#include <string>
#include <vector>

namespace forge::cli {

using Argv = std::vector<std::string>;

int cmd_train(const Argv& argv);
int cmd_eval(const Argv& argv);
int cmd_generate(const Argv& argv);
int cmd_quickstart(const Argv& argv);
// forge bench gemm|train|attention (cmd_bench_gpu.cpp), called by cmd_bench.
int bench_gpu(const std::string& what, const Argv& argv);
// forge bench generate (cmd_bench_generate.cpp).
int bench_generate(const Argv& argv);
// forge bench serve (cmd_bench_serve.cpp).
int bench_serve(const Argv& argv);
// forge bench prepare (cmd_bench_prepare.cpp).
int bench_prepare(const Argv& argv);
int cmd_tokenizer(const Argv& argv);
int cmd_data(const Argv& argv);
int cmd_bench(const Argv& argv);
int cmd_inspect(const Argv& argv);
int cmd_validate(const Argv& argv);
int cmd_chat_template(const Argv& argv);
int cmd_merge(const Argv& argv);
int cmd_serve(const Argv& argv);

}  // namespace forge::cli
