// The real training programs as processes: `drover train` and drover-trainer (as the
// worker agent starts it, with DROVER_* variables and a status pipe).
#include "tests/integration/train_process.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/exit_codes.h"
#include "common/token_shard.h"
#include "tests/unit/worker/engine/data/gpt2_test_vocab.h"
#include "worker/engine/data/tokenizer.h"

namespace drover {
namespace {

class TrainProcessTest : public TrainProcessFixture {};

TEST_F(TrainProcessTest, DroverTrainWritesMetricsCheckpointsAndModel) {
  const std::string spec = WriteSpec(12, 5);
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "train", spec, "--threads", "1"})), 0) << Log();
  EXPECT_EQ(MetricsLines().size(), 12u);
  EXPECT_TRUE(fs::exists(dir_ / "out" / "model.bin"));
  // keep_last 2 of {5, 10, 12 (final)}.
  EXPECT_FALSE(fs::exists(dir_ / "out" / "ckpt" / "step_5"));
  EXPECT_TRUE(fs::exists(dir_ / "out" / "ckpt" / "step_10" / "manifest.json"));
  EXPECT_TRUE(fs::exists(dir_ / "out" / "ckpt" / "step_12" / "manifest.json"));

  // The model file works with the other tools.
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "eval", (dir_ / "out" / "model.bin").string(), "--data",
                        (dir_ / "train.bin").string(), "--batches", "3", "--seq", "16", "--json"})),
            0)
      << Log();
  EXPECT_THAT(Log(), ::testing::HasSubstr("{\"loss\":"));
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "sample", (dir_ / "out" / "model.bin").string(),
                        "--tokens", "10", "--seed", "1"})),
            0)
      << Log();

  // So do its checkpoints, while a run trains: a step directory, or the checkpoint directory
  // for its newest. The last one holds the final model: the same loss to the last digit.
  auto loss_of = [&](const fs::path& model) {
    fs::remove(dir_ / "log.txt");
    EXPECT_EQ(
        Wait(Spawn({kBin + "drover", "eval", model.string(), "--data",
                    (dir_ / "train.bin").string(), "--batches", "3", "--seq", "16", "--json"})),
        0)
        << Log();
    const std::string out = Log();
    const size_t at = out.find("{\"loss\":");
    EXPECT_NE(at, std::string::npos) << out;
    return at == std::string::npos ? std::string() : out.substr(at, out.find(',', at) - at);
  };
  const std::string final_loss = loss_of(dir_ / "out" / "model.bin");
  EXPECT_EQ(loss_of(dir_ / "out" / "ckpt" / "step_12"), final_loss);
  EXPECT_EQ(loss_of(dir_ / "out" / "ckpt"), final_loss);
  EXPECT_NE(loss_of(dir_ / "out" / "ckpt" / "step_10"), final_loss);
  fs::remove(dir_ / "log.txt");
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "export", (dir_ / "out" / "ckpt" / "step_10").string(),
                        "--format", "hf", "-o", (dir_ / "step10-hf").string()})),
            0)
      << Log();
  EXPECT_TRUE(fs::exists(dir_ / "step10-hf" / "model.safetensors"));
  EXPECT_EQ(loss_of(dir_ / "step10-hf"), loss_of(dir_ / "out" / "ckpt" / "step_10"));
}

// train.schedule wsd: a 20-step run whose decay would start at step 10, stopped after its
// checkpoint of step 5 (stable phase), submitted again with 40 steps, trains steps 6 .. 40
// with the very losses and learning rates of a fresh 40-step run; the 20-step run itself
// parted from them where its decay began.
TEST_F(TrainProcessTest, AWsdRunContinuedFromItsStablePhaseEqualsOneAskedForMoreStepsAtOnce) {
  const std::string spec = WriteSpec(20, 5);
  const auto train = [&](int steps, const std::string& out, const std::string& ckpt) {
    return Wait(
        Spawn({kBin + "drover", "train", spec, "--threads", "1", "--set", "train.schedule=wsd",
               "--set", "train.decay_fraction=0.5", "--set", "train.steps=" + std::to_string(steps),
               "--set", "checkpoint.keep_last=10", "--set", "output_dir=" + (dir_ / out).string(),
               "--set", "checkpoint.dir=" + (dir_ / ckpt).string()}));
  };
  // step -> the metrics line's "loss" and "lr" fields, as written.
  const auto steps_of = [&](const std::string& out) {
    std::map<int, std::string> rows;
    std::ifstream in(dir_ / out / "metrics.jsonl");
    for (std::string l; std::getline(in, l);) {
      const size_t step = l.find("\"step\":"), loss = l.find("\"loss\":"), lr = l.find("\"lr\":");
      if (step == std::string::npos || loss == std::string::npos || lr == std::string::npos) {
        continue;
      }
      rows[std::stoi(l.substr(step + 7))] =
          l.substr(loss, l.find(',', loss) - loss) + " " + l.substr(lr, l.find(',', lr) - lr);
    }
    return rows;
  };
  ASSERT_EQ(train(40, "fresh", "fresh-ckpt"), 0) << Log();
  ASSERT_EQ(train(20, "short", "ckpt"), 0) << Log();
  for (int step : {10, 15, 20}) fs::remove_all(dir_ / "ckpt" / ("step_" + std::to_string(step)));
  ASSERT_EQ(train(40, "continued", "ckpt"), 0) << Log();
  EXPECT_THAT(Log(), ::testing::HasSubstr("resumed from checkpoint " +
                                          (dir_ / "ckpt" / "step_5").string()));

  const std::map<int, std::string> fresh = steps_of("fresh"), shorter = steps_of("short"),
                                   continued = steps_of("continued");
  ASSERT_EQ(fresh.size(), 40u);
  ASSERT_EQ(continued.size(), 35u);
  for (const auto& [step, row] : continued) EXPECT_EQ(row, fresh.at(step)) << "step " << step;
  // Its 20-step run: decay over optimizer steps 10 .. 19 (metrics steps 11 .. 20), the first
  // of them still at the peak; the 40-step run's decays over its last 20.
  ASSERT_EQ(shorter.size(), 20u);
  for (int step = 1; step <= 11; ++step) EXPECT_EQ(shorter.at(step), fresh.at(step)) << step;
  EXPECT_NE(shorter.at(12), fresh.at(12));
}

// drover eval --hellaswag on a benchmark file of HellaSwag's shape, whose right endings the
// training text teaches ("ann likes figs."): a model trained for 400 steps picks every one,
// where the same model untrained picks fewer. The job scores the same file as it trains
// (drover data hellaswag, data.hellaswag): its last evaluation finds what drover eval finds.
// Matching transformers on a random model is tests/tools/hellaswag_check.py's job (by hand: it
// needs PyTorch).
TEST_F(TrainProcessTest, ATrainedModelPicksTheHellaSwagEndingsItsTextTeaches) {
  const std::vector<std::pair<std::string, std::string>> likes = {
      {"ann", "figs"}, {"bob", "nuts"}, {"cal", "jam"}, {"dan", "tea"}};
  std::mt19937_64 rng(3);
  {
    std::ofstream text(dir_ / "likes.txt");
    for (int i = 0; i < 3000; ++i) {
      const auto& [who, what] = likes[rng() % likes.size()];
      text << who << " likes " << what << ". ";
    }
  }
  std::ofstream bench(dir_ / "likes.jsonl");
  for (size_t i = 0; i < likes.size(); ++i) {
    for (const std::string& before :
         {std::string(), likes[(i + 1) % 4].first + " likes " + likes[(i + 1) % 4].second + ". "}) {
      bench << R"({"ctx": ")" << before << likes[i].first << R"( likes", "endings": ["figs.", )"
            << R"("nuts.", "jam.", "tea."], "label": )" << i << "}\n";
    }
  }
  bench.close();
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "data", "prepare", (dir_ / "likes.txt").string(), "--out",
                        (dir_ / "likes").string()})),
            0)
      << Log();
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "data", "hellaswag", (dir_ / "likes.jsonl").string(),
                        "--out", (dir_ / "likes-hellaswag.bin").string()})),
            0)
      << Log();
  EXPECT_THAT(Log(), ::testing::HasSubstr("hellaswag: 8 examples, 32 endings"));
  std::ofstream(dir_ / "likes.yaml")
      << "name: likes\noutput_dir: " << (dir_ / "likes-out").string()
      << "\nmodel: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 32, vocab_size: 256}\n"
      << "data: {train: " << (dir_ / "likes" / "train_*.bin").string()
      << ", hellaswag: " << (dir_ / "likes-hellaswag.bin").string() << "}\n"
      << "train: {steps: 400, global_batch: 8, micro_batch: 8, seq_len: 32, lr: 0.01, "
         "warmup_steps: 10, eval_every: 200}\ncheckpoint: {every_steps: 0}\n";
  fs::remove(dir_ / "log.txt");
  ASSERT_EQ(
      Wait(Spawn({kBin + "drover", "train", (dir_ / "likes.yaml").string(), "--threads", "1"})), 0)
      << Log();
  EXPECT_THAT(Log(), ::testing::HasSubstr("| hellaswag 1.0000"));
  {
    std::ifstream metrics(dir_ / "likes-out" / "metrics.jsonl");
    std::string line, last;
    int evaluated = 0;
    while (std::getline(metrics, line)) {
      if (line.find("\"hellaswag\":") != std::string::npos) ++evaluated, last = line;
    }
    EXPECT_EQ(evaluated, 2) << "steps 200 and 400";
    EXPECT_THAT(last, ::testing::HasSubstr("\"step\":400,"));
    EXPECT_THAT(last, ::testing::HasSubstr("\"hellaswag\":1"));
  }
  ASSERT_EQ(Wait(Spawn({kBin + "drover-gpt-logits", "write", (dir_ / "untrained.bin").string(),
                        "--layers", "2", "--heads", "2", "--embd", "32", "--vocab", "256",
                        "--block", "32", "--seed", "3"})),
            0)
      << Log();
  auto acc_norm = [&](const fs::path& model) {
    fs::remove(dir_ / "log.txt");
    EXPECT_EQ(Wait(Spawn({kBin + "drover", "eval", model.string(), "--hellaswag",
                          (dir_ / "likes.jsonl").string(), "--json"})),
              0)
        << Log();
    const std::string out = Log();
    const size_t at = out.find("\"hellaswag_acc_norm\":");
    EXPECT_NE(at, std::string::npos) << out;
    EXPECT_NE(out.find("\"hellaswag_examples\":8"), std::string::npos) << out;
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 21));
  };
  EXPECT_EQ(acc_norm(dir_ / "likes-out" / "model.bin"), 1.0);
  EXPECT_LT(acc_norm(dir_ / "untrained.bin"), 1.0);

  // A bad file is refused naming the line, with the usage exit code.
  std::ofstream(dir_ / "bad.jsonl") << R"({"ctx": "ann likes", "endings": ["figs."], "label": 0})";
  fs::remove(dir_ / "log.txt");
  EXPECT_EQ(Wait(Spawn({kBin + "drover", "eval", (dir_ / "untrained.bin").string(), "--hellaswag",
                        (dir_ / "bad.jsonl").string()})),
            2);
  EXPECT_THAT(Log(), ::testing::HasSubstr("bad.jsonl:1: \"endings\" must be an array"));
}

// drover data prepare of JSON lines documents (as corpora ship): each document's text, with
// GPT-2's <|endoftext|> before it, streamed into train shards of exactly --shard-tokens
// tokens (the last one shorter), the documents starting in the last --val-fraction of the
// bytes into val.bin; the same tokens as the tokenizer gives each document on its own.
TEST_F(TrainProcessTest, JsonLinesDocumentsArePreparedWithEndOfTextBetweenThem) {
  const fs::path encoder = dir_ / "encoder.json", merges = dir_ / "vocab.bpe";
  engine::WriteGpt2TestVocab(encoder.string(), merges.string());
  auto tok = engine::LoadGpt2Tokenizer(encoder.string(), merges.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<std::string> docs = {"hello the world", "tell the hell\n", "x", "the end"};
  std::vector<uint16_t> expected;
  {
    std::ofstream out(dir_ / "docs.jsonl");
    for (size_t i = 0; i < docs.size(); ++i) {
      // Other keys are ignored; a blank line is skipped.
      out << R"({"id": )" << i << R"(, "body": ")" << (i == 1 ? "tell the hell\\n" : docs[i])
          << "\"}\n"
          << (i == 0 ? "\n" : "");
      expected.push_back(static_cast<uint16_t>((*tok)->eot_token()));
      for (int32_t id : (*tok)->Encode(docs[i])) expected.push_back(static_cast<uint16_t>(id));
    }
  }
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "data", "prepare", (dir_ / "docs.jsonl").string(), "--out",
                        (dir_ / "docs").string(), "--tokenizer", "gpt2", "--encoder",
                        encoder.string(), "--merges", merges.string(), "--text-field", "body",
                        "--val-fraction", "0", "--shard-tokens", "7"})),
            0)
      << Log();
  std::vector<uint16_t> got;
  for (int shard = 0;; ++shard) {
    char name[32];
    std::snprintf(name, sizeof(name), "train_%06d.bin", shard);
    if (!fs::exists(dir_ / "docs" / name)) break;
    auto tokens = ReadTokenShard((dir_ / "docs" / name).string());
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    EXPECT_LE(tokens->size(), 7u) << name;
    got.insert(got.end(), tokens->begin(), tokens->end());
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(fs::file_size(dir_ / "docs" / "train_000000.bin"), 1024 + 7 * 2) << "a full shard";
  // Tokenized on three threads, the same shards.
  ASSERT_EQ(Wait(Spawn({kBin + "drover",  "data",
                        "prepare",        (dir_ / "docs.jsonl").string(),
                        "--out",          (dir_ / "docs3").string(),
                        "--tokenizer",    "gpt2",
                        "--encoder",      encoder.string(),
                        "--merges",       merges.string(),
                        "--text-field",   "body",
                        "--val-fraction", "0",
                        "--shard-tokens", "7",
                        "--threads",      "3"})),
            0)
      << Log();
  for (const char* name : {"train_000000.bin", "train_000001.bin", "train_000002.bin"}) {
    EXPECT_EQ(ReadTokenShard((dir_ / "docs3" / name).string()).value(),
              ReadTokenShard((dir_ / "docs" / name).string()).value())
        << name;
  }
  EXPECT_FALSE(fs::exists(dir_ / "docs" / "val.bin"));

  // Half the bytes for validation: the documents that start in the second half.
  ASSERT_EQ(
      Wait(Spawn({kBin + "drover", "data", "prepare", (dir_ / "docs.jsonl").string(), "--out",
                  (dir_ / "split").string(), "--tokenizer", "gpt2", "--encoder", encoder.string(),
                  "--merges", merges.string(), "--text-field", "body", "--val-fraction", "0.5"})),
      0)
      << Log();
  auto train = ReadTokenShard((dir_ / "split" / "train_000000.bin").string());
  auto val = ReadTokenShard((dir_ / "split" / "val.bin").string());
  ASSERT_TRUE(train.ok() && val.ok());
  std::vector<uint16_t> both(train->begin(), train->end());
  both.insert(both.end(), val->begin(), val->end());
  EXPECT_EQ(both, expected);
  EXPECT_FALSE(val->empty());
  EXPECT_FALSE(train->empty());
  EXPECT_EQ(val->front(), (*tok)->eot_token()) << "val starts at a document";

  // A line without the field is refused naming file, line and key.
  std::ofstream(dir_ / "bad.jsonl") << R"({"text": "a"})"
                                    << "\n"
                                    << R"({"body": 3})"
                                    << "\n";
  fs::remove(dir_ / "log.txt");
  EXPECT_EQ(Wait(Spawn({kBin + "drover", "data", "prepare", (dir_ / "bad.jsonl").string(), "--out",
                        (dir_ / "bad").string()})),
            2);
  EXPECT_THAT(Log(), ::testing::HasSubstr("bad.jsonl:2: no string \"text\""));
}

// A model laid out as the Hugging Face Hub lays out GPT-2 (drover export --format hf, and
// the tokenizer's vocab.json and merges.txt beside it) is used as a directory: `drover
// sample DIR` finds its tokenizer there, and `train.init_from: DIR` fine-tunes it.
TEST_F(TrainProcessTest, AHuggingFaceDirectorySamplesWithItsTokenizerAndFineTunes) {
  const fs::path hf = dir_ / "gpt2";
  ASSERT_EQ(Wait(Spawn({kBin + "drover-gpt-logits", "write", (dir_ / "m.bin").string(), "--layers",
                        "1", "--heads", "2", "--embd", "16", "--vocab", "262", "--block", "16",
                        "--seed", "3"})),
            0)
      << Log();
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "export", (dir_ / "m.bin").string(), "--format", "hf",
                        "-o", hf.string()})),
            0)
      << Log();
  engine::WriteGpt2TestVocab((hf / "vocab.json").string(), (hf / "merges.txt").string());
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "sample", hf.string(), "--prompt", "hello the", "--tokens",
                        "4", "--temperature", "0"})),
            0)
      << Log();
  EXPECT_THAT(Log(), ::testing::HasSubstr("GPT-2 tokenizer from " + (hf / "vocab.json").string()));
  EXPECT_THAT(Log(), ::testing::HasSubstr("hello the"));
  fs::remove(dir_ / "log.txt");
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "sample", hf.string(), "--tokenizer", "byte", "--prompt",
                        "x", "--tokens", "2"})),
            0)
      << Log();
  EXPECT_THAT(Log(), ::testing::Not(::testing::HasSubstr("GPT-2 tokenizer")));
  const std::string spec = WriteSpec(3, 0);
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "train", spec, "--set", "train.init_from=" + hf.string(),
                        "--threads", "1"})),
            0)
      << Log();
  EXPECT_THAT(Log(), ::testing::HasSubstr("has shapes L=1 NH=2 C=16 maxT=16 V=262; they replace "
                                          "the spec's model section"));
  EXPECT_EQ(MetricsLines().size(), 3u);
}

TEST_F(TrainProcessTest, InvalidInputExitsTwoWithAMessage) {
  EXPECT_EQ(Wait(Spawn({kBin + "drover", "train", (dir_ / "missing.yaml").string()})), 2);
  const std::string spec = WriteSpec(4, 0);
  EXPECT_EQ(Wait(Spawn({kBin + "drover", "train", spec, "--set", "model.vocab_size=8"})), 2);
  EXPECT_THAT(Log(), ::testing::HasSubstr("model.vocab_size is 8"));
  EXPECT_EQ(Wait(Spawn({kBin + "drover", "eval", (dir_ / "nope.bin").string(), "--data",
                        (dir_ / "train.bin").string()})),
            2);
  EXPECT_EQ(Wait(Spawn({kBin + "drover", "train", spec}, {"DROVER_PEAK_TFLOPS=fast"})), 2);
  EXPECT_THAT(
      Log(), ::testing::HasSubstr("DROVER_PEAK_TFLOPS='fast' is not a positive number of TFLOP/s"));
}

// A checkpoint directory whose every checkpoint is broken: `drover ckpt` shows which and
// why, and a resume refuses to start from scratch over them until told to (--fresh).
TEST_F(TrainProcessTest, UnusableCheckpointsAreListedAndRefuseASilentFreshStart) {
  const std::string spec = WriteSpec(10, 5);
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "train", spec, "--threads", "1"})), 0) << Log();
  const fs::path ckpt = dir_ / "out" / "ckpt";
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "ckpt", "ls", ckpt.string()})), 0) << Log();
  EXPECT_THAT(Log(), ::testing::HasSubstr("step_10"));
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "ckpt", "verify", ckpt.string()})), 0) << Log();
  EXPECT_THAT(Log(), ::testing::HasSubstr("ok      " + (ckpt / "step_10").string()));

  fs::resize_file(ckpt / "step_10" / "params.r0.bin", 8);
  { std::ofstream(ckpt / "step_5" / "manifest.json") << "{"; }
  EXPECT_EQ(Wait(Spawn({kBin + "drover", "ckpt", "verify", ckpt.string()})), 1);
  EXPECT_THAT(Log(),
              ::testing::HasSubstr("BROKEN  " + (ckpt / "step_10" / "params.r0.bin").string()));
  EXPECT_THAT(Log(), ::testing::HasSubstr("2 of 2 checkpoints cannot be used"));

  const std::string spec20 = WriteSpec(20, 5);
  EXPECT_EQ(Wait(Spawn({kBin + "drover", "train", spec20, "--threads", "1"})), 2);
  EXPECT_THAT(Log(), ::testing::HasSubstr("but none is usable"));
  EXPECT_TRUE(fs::exists(ckpt / "step_10"));  // nothing was overwritten
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "train", spec20, "--threads", "1", "--fresh"})), 0)
      << Log();
  EXPECT_EQ(MetricsLines().size(), 10u + 20u);
}

// `drover train` in one process takes SIGUSR1 (a checkpoint now) and SIGUSR2 (a checkpoint,
// then stop: exit 75) even though OpenBLAS starts its threads, with the signals unblocked,
// before main: one landing there used to kill the process (their default action).
TEST_F(TrainProcessTest, InProcessDroverTrainTakesCheckpointAndDrainSignals) {
  const std::string spec = WriteSpec(10000000, 10000000);
  const pid_t pid = Spawn({kBin + "drover", "train", spec, "--threads", "2"});
  auto wait_for = [&](const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done();
  };
  auto saved = [&] {
    int n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_ / "out" / "ckpt", ec)) {
      n += fs::exists(e.path() / "manifest.json") ? 1 : 0;
    }
    return n;
  };
  ASSERT_TRUE(wait_for([&] { return MetricsLines().size() >= 3; })) << Log();
  for (int i = 0; i < 5; ++i) ASSERT_EQ(kill(pid, SIGUSR1), 0);  // whichever thread takes it
  ASSERT_TRUE(wait_for([&] { return saved() >= 1; })) << Log();
  EXPECT_EQ(kill(pid, 0), 0) << "SIGUSR1 killed drover train";
  ASSERT_EQ(kill(pid, SIGUSR2), 0);
  EXPECT_EQ(Wait(pid), kExitDrained) << Log();
  EXPECT_THAT(Log(), ::testing::HasSubstr("drained after checkpoint step"));
  EXPECT_GE(saved(), 2);
}

TEST_F(TrainProcessTest, TrainerUnderAgentProtocolReportsAndResumesAfterSigterm) {
  // Slow enough per step (bigger model) that SIGTERM lands mid-run.
  const std::string spec = WriteSpec(400, 10, 128);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::vector<std::string> env = {
      "DROVER_SPEC=" + spec,      "DROVER_JOB_ID=j-test",
      "DROVER_ATTEMPT=1",         "DROVER_RANK=0",
      "DROVER_WORLD_SIZE=1",      "DROVER_THREADS=1",
      "DROVER_PEAK_TFLOPS=0.001", "DROVER_STATUS_FD=" + std::to_string(fds[1])};
  pid_t pid = Spawn({kBin + "drover-trainer"}, env);
  close(fds[1]);
  // Read reports until a checkpoint has been reported, then stop the trainer.
  std::string reports;
  char buf[4096];
  while (reports.find("\"checkpoint\"") == std::string::npos) {
    ssize_t n = read(fds[0], buf, sizeof(buf));
    ASSERT_GT(n, 0) << "trainer exited early: " << Log();
    reports.append(buf, static_cast<size_t>(n));
  }
  kill(pid, SIGTERM);
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = Wait(pid);
  const double stop_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(fds[0]);
  EXPECT_EQ(rc, 1) << Log();
  EXPECT_LT(stop_s, 5.0);
  EXPECT_THAT(reports, ::testing::HasSubstr("\"progress\""));
  // Its MFU against the peak it was given, in its reports (drover status, the dashboard) and
  // its metrics.
  EXPECT_THAT(reports, ::testing::HasSubstr("\"mfu\":"));
  EXPECT_THAT(MetricsLines().back(), ::testing::HasSubstr("\"mfu\":"));
  EXPECT_THAT(reports, ::testing::HasSubstr("j-test"));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "model.bin"));
  const size_t before = MetricsLines().size();
  ASSERT_GE(before, 10u);

  // A second attempt resumes from the newest checkpoint; 3 more steps finish the job.
  const std::string short_spec = WriteSpec(static_cast<int>(before / 10 * 10 + 3), 10, 128);
  std::vector<std::string> env2 = {"DROVER_SPEC=" + short_spec, "DROVER_ATTEMPT=2",
                                   "DROVER_THREADS=1"};
  ASSERT_EQ(Wait(Spawn({kBin + "drover-trainer"}, env2)), 0) << Log();
  EXPECT_THAT(Log(), ::testing::HasSubstr("resumed from checkpoint"));
  const auto lines = MetricsLines();
  EXPECT_EQ(lines.size(), before + 3);
  EXPECT_THAT(lines.back(), ::testing::HasSubstr("\"attempt\":2"));
  EXPECT_TRUE(fs::exists(dir_ / "out" / "model.bin"));
}

// A checkpoint directory on a real, small file system (a 512 KiB tmpfs) that fills up: room
// for one checkpoint of this model (~330 KiB) but not for a second beside it. Every later
// save fails with a clear message and cleans up after itself, training goes on, the model
// is written (its own disk has room), and the one checkpoint that fitted stays whole and
// resumes. Needs mount(2): skipped where the test may not mount.
TEST_F(TrainProcessTest, FullCheckpointDiskFailsSavesCleanlyAndKeepsTheGoodCheckpoint) {
  const fs::path ckpt = dir_ / "out" / "ckpt";
  fs::create_directories(ckpt);
  if (std::system(
          ("mount -t tmpfs -o size=512k drover-test " + ckpt.string() + " 2>/dev/null").c_str()) !=
      0) {
    GTEST_SKIP() << "cannot mount a tmpfs here";
  }
  struct Unmount {
    fs::path at;
    ~Unmount() { (void)std::system(("umount " + at.string()).c_str()); }
  } unmount{ckpt};
  const std::string spec = WriteSpec(20, 5);
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "train", spec, "--threads", "1"})), 0) << Log();
  EXPECT_EQ(MetricsLines().size(), 20u);
  EXPECT_TRUE(fs::exists(dir_ / "out" / "model.bin"));
  EXPECT_THAT(Log(), ::testing::HasSubstr("No space left on device"));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(ckpt)) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"step_5"}) << Log();
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "ckpt", "verify", ckpt.string()})), 0) << Log();

  // It resumes from the checkpoint that fitted.
  ASSERT_EQ(Wait(Spawn({kBin + "drover", "train", WriteSpec(8, 0), "--threads", "1"})), 0) << Log();
  EXPECT_THAT(Log(), ::testing::HasSubstr("resumed from checkpoint " + (ckpt / "step_5").string()));
  EXPECT_EQ(MetricsLines().size(), 20u + 3u);
}

}  // namespace
}  // namespace drover
