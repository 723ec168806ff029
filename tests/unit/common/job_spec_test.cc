#include "common/job_spec.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "common/files.h"

namespace drover {
namespace {

// The example of DESIGN.md "Job spec", verbatim.
constexpr char kDesignExample[] = R"(name: shakespeare-char
output_dir: runs/shakespeare-char   # metrics.jsonl, logs, final model
model:                              # GPT-2 family
  n_layer: 4
  n_head: 4
  n_embd: 128
  block_size: 64                    # longest sequence the model accepts
  vocab_size: 256
data:
  train: data/shakespeare/train_*.bin   # llm.c token shards, glob allowed
  val: data/shakespeare/val.bin
train:
  steps: 2000
  global_batch: 12                  # sequences per optimizer step, across all dp ranks
  micro_batch: 12                   # sequences per forward/backward on one dp rank
  seq_len: 64
  lr: 1.0e-3
  min_lr: 1.0e-4
  warmup_steps: 100
  schedule: cosine                  # cosine | linear | constant
  weight_decay: 0.1
  beta1: 0.9
  beta2: 0.99
  grad_clip: 1.0
  seed: 1337
  eval_every: 250
  eval_batches: 20
  init_from: ""                     # optional llm.c model file to start from
precision:
  dtype: fp32                       # fp32 | bf16 | fp16
  loss_scale: dynamic               # dynamic | a number (fp16 only)
parallel:
  dp: auto                          # auto = world_size / (pp * tp)
  pp: 1
  tp: 1
  zero_stage: 0                     # 0 | 1 | 2 | 3
  pp_schedule: 1f1b                 # gpipe | 1f1b
resources:
  device: cpu                       # cpu | cuda
  world_size: {min: 1, max: 1}
  threads_per_rank: 1
checkpoint:
  dir: runs/shakespeare-char/ckpt
  every_steps: 200
  keep_last: 3
  async: true
fault_tolerance:
  max_restarts: 10
  hang_timeout_s: 120
  spike_rollback: {enabled: false, factor: 3.0, window: 50, skip_steps: 20}
)";

// The smallest valid spec; bodies appended to it start at line 3.
std::string Minimal(const std::string& body = "") { return "name: t\ndata: {train: x}\n" + body; }

TEST(JobSpecTest, ParsesTheDesignExample) {
  StatusOr<JobSpec> spec = ParseJobSpec(kDesignExample);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "shakespeare-char");
  EXPECT_EQ(spec->model.n_embd, 128);
  EXPECT_EQ(spec->data.train, "data/shakespeare/train_*.bin");
  EXPECT_EQ(spec->data.val, "data/shakespeare/val.bin");
  EXPECT_EQ(spec->train.steps, 2000);
  EXPECT_DOUBLE_EQ(spec->train.lr, 1.0e-3);
  EXPECT_DOUBLE_EQ(spec->train.min_lr, 1.0e-4);
  EXPECT_EQ(spec->train.seed, 1337u);
  EXPECT_EQ(spec->train.init_from, "");
  EXPECT_EQ(spec->parallel.dp, 0);
  EXPECT_EQ(spec->parallel.pp_schedule, "1f1b");
  EXPECT_EQ(spec->resources.world_size.min, 1);
  EXPECT_EQ(spec->resources.world_size.max, 1);
  EXPECT_EQ(spec->checkpoint.dir, "runs/shakespeare-char/ckpt");
  EXPECT_TRUE(spec->checkpoint.async);
  EXPECT_FALSE(spec->fault_tolerance.spike_rollback.enabled);
  EXPECT_EQ(spec->fault_tolerance.spike_rollback.window, 50);
  EXPECT_EQ(spec->FeasibleWorldSizes(), std::vector<int>{1});
}

TEST(JobSpecTest, FillsDefaultsFromOnePlace) {
  StatusOr<JobSpec> spec = ParseJobSpec(Minimal());
  ASSERT_TRUE(spec.ok()) << spec.status();
  const JobSpec defaults;
  EXPECT_EQ(spec->output_dir, "runs/t");
  EXPECT_EQ(spec->checkpoint.dir, "runs/t/ckpt");
  EXPECT_EQ(spec->model.n_layer, defaults.model.n_layer);
  EXPECT_EQ(spec->train.global_batch, defaults.train.global_batch);
  EXPECT_EQ(spec->train.schedule, "cosine");
  EXPECT_EQ(spec->precision.loss_scale, "dynamic");
  EXPECT_EQ(spec->parallel.dp, 0);
  EXPECT_EQ(spec->checkpoint.keep_last, 3);
}

TEST(JobSpecTest, CheckpointDirFollowsOutputDir) {
  StatusOr<JobSpec> spec = ParseJobSpec(Minimal("output_dir: /scratch/run7\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->checkpoint.dir, "/scratch/run7/ckpt");
}

TEST(JobSpecTest, WorldSizeMayBeAPlainInteger) {
  StatusOr<JobSpec> spec =
      ParseJobSpec(Minimal("resources: {world_size: 4}\n"
                           "train: {global_batch: 16, micro_batch: 4}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->resources.world_size.min, 4);
  EXPECT_EQ(spec->resources.world_size.max, 4);
}

TEST(JobSpecTest, ExplicitDpAndEmptySections) {
  StatusOr<JobSpec> spec = ParseJobSpec(
      Minimal("parallel: {dp: 2}\nresources: {world_size: 2}\ntrain: {micro_batch: 6}\n"
              "checkpoint:\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->parallel.dp, 2);
  EXPECT_EQ(spec->checkpoint.every_steps, 200);
}

TEST(JobSpecTest, OverridesApplyInOrderAndReachNestedKeys) {
  StatusOr<JobSpec> spec =
      ParseJobSpec(Minimal("resources: {world_size: 4}\ntrain: {micro_batch: 3}\n"),
                   {"train.steps=10", "train.steps=20", "resources.world_size.min=2",
                    "fault_tolerance.spike_rollback.enabled=true", "data.train=*.bin",
                    "train.lr=3e-4", "parallel.dp=auto"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train.steps, 20);
  EXPECT_EQ(spec->resources.world_size.min, 2);
  EXPECT_EQ(spec->resources.world_size.max, 4);  // the scalar 4 became {min: 4, max: 4}
  EXPECT_TRUE(spec->fault_tolerance.spike_rollback.enabled);
  EXPECT_EQ(spec->data.train, "*.bin");  // not valid YAML (an alias), so taken literally
  EXPECT_DOUBLE_EQ(spec->train.lr, 3e-4);
  EXPECT_EQ(spec->FeasibleWorldSizes(), (std::vector<int>{2, 4}));  // 12 / 3 = 4 per dp
}

TEST(JobSpecTest, OverrideOfWholeWorldSize) {
  StatusOr<JobSpec> spec =
      ParseJobSpec(Minimal(), {"resources.world_size=3", "train.micro_batch=4"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->resources.world_size.min, 3);
  EXPECT_EQ(spec->resources.world_size.max, 3);
}

TEST(JobSpecTest, ApplyOverridesReturnsTheEffectiveSpec) {
  StatusOr<std::string> text = ApplyOverrides(kDesignExample, {"train.steps=7", "name=other"});
  ASSERT_TRUE(text.ok()) << text.status();
  StatusOr<JobSpec> spec = ParseJobSpec(*text);
  ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << *text;
  EXPECT_EQ(spec->train.steps, 7);
  EXPECT_EQ(spec->name, "other");
  EXPECT_EQ(spec->output_dir, "runs/shakespeare-char");  // written in the file, so kept
  EXPECT_EQ(spec->train.seed, 1337u);

  StatusOr<std::string> same = ApplyOverrides(kDesignExample, {});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, kDesignExample);  // comments and layout kept when nothing changes

  StatusOr<std::string> bad = ApplyOverrides(kDesignExample, {"train.micro_batch=24"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("train.micro_batch (from --set): 24 is larger"),
            std::string::npos)
      << bad.status();
}

TEST(JobSpecTest, RoundTripsThroughYaml) {
  StatusOr<JobSpec> spec = ParseJobSpec(
      kDesignExample,
      {"train.lr=0.1", "train.eps=1e-10", "train.seed=18446744073709551615", "parallel.pp=2",
       "parallel.dp=1", "resources.device=cuda", "precision.dtype=fp16",
       "precision.loss_scale=1024", "resources.world_size=2", "checkpoint.async=false",
       "train.init_from=weights: v2.bin", "name=x.y_z-1", "fault_tolerance.hang_timeout_s=0.5"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string yaml = JobSpecToYaml(*spec);
  StatusOr<JobSpec> again = ParseJobSpec(yaml);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
  EXPECT_EQ(JobSpecToYaml(*again), yaml);
  EXPECT_EQ(again->train.lr, 0.1);  // exact, not approximately
  EXPECT_EQ(again->train.eps, 1e-10);
  EXPECT_EQ(again->train.seed, 18446744073709551615u);
  EXPECT_EQ(again->parallel.dp, 1);
  EXPECT_EQ(again->precision.loss_scale, "1024");
  EXPECT_EQ(again->train.init_from, "weights: v2.bin");
  EXPECT_FALSE(again->checkpoint.async);
  EXPECT_EQ(again->fault_tolerance.hang_timeout_s, 0.5);
  EXPECT_NE(yaml.find("dp: 1"), std::string::npos) << yaml;
}

// parallel.pp_layers from YAML and from --set in either spelling, and back through YAML.
TEST(JobSpecTest, PipelineLayerCountsParseFromYamlAndSet) {
  const std::string base = std::string(kDesignExample);
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{"parallel.pp=2", "resources.world_size=2",
                                 "parallel.pp_layers=3,1"},
        std::vector<std::string>{"parallel.pp=2", "resources.world_size=2",
                                 "parallel.pp_layers=[3, 1]"}}) {
    StatusOr<JobSpec> spec = ParseJobSpec(base, sets);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->parallel.pp_layers, (std::vector<int>{3, 1}));
    const std::string yaml = JobSpecToYaml(*spec);
    EXPECT_NE(yaml.find("pp_layers: [3, 1]"), std::string::npos) << yaml;
    StatusOr<JobSpec> again = ParseJobSpec(yaml);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->parallel.pp_layers, (std::vector<int>{3, 1}));
  }
  StatusOr<JobSpec> even = ParseJobSpec(base);
  ASSERT_TRUE(even.ok());
  EXPECT_TRUE(even->parallel.pp_layers.empty());
  StatusOr<JobSpec> again = ParseJobSpec(JobSpecToYaml(*even));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->parallel.pp_layers.empty());
}

TEST(JobSpecTest, DefaultSpecSerializesEveryKey) {
  JobSpec spec;
  spec.name = std::string("d");
  spec.data.train = std::string("x");
  const std::string yaml = JobSpecToYaml(spec);
  for (const char* key :
       {"name:", "output_dir:", "vocab_size:", "log_every:", "loss_scale:", "dp: auto",
        "pp_schedule:", "pp_chunks: auto", "threads_per_rank:", "time_limit_minutes: 0",
        "every_steps:", "every_minutes:", "skip_steps:", "eps:", "recompute: none"}) {
    EXPECT_NE(yaml.find(key), std::string::npos) << key << " missing in\n" << yaml;
  }
  StatusOr<JobSpec> again = ParseJobSpec(yaml);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
  EXPECT_EQ(again->output_dir, "runs/d");
}

TEST(JobSpecTest, RecomputeTakesNoneAllOrACountAndRoundTrips) {
  for (const auto& [text, want] : std::vector<std::pair<std::string, int>>{
           {"none", 0}, {"all", TrainSpec::kRecomputeAll}, {"0", 0}, {"3", 3}, {"4", 4}}) {
    StatusOr<JobSpec> spec = ParseJobSpec(Minimal(), {"train.recompute=" + text});
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_EQ(spec->train.recompute, want) << text;
    StatusOr<JobSpec> again = ParseJobSpec(JobSpecToYaml(*spec));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->train.recompute, want) << text;
  }
  EXPECT_EQ(ParseJobSpec(Minimal())->train.recompute, 0);
}

TEST(JobSpecTest, ValidateWorksWithoutYaml) {
  JobSpec spec;
  spec.name = std::string("n");
  spec.data.train = std::string("x");
  EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();
  spec.train.micro_batch = 24;
  Status st = spec.Validate();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "train.micro_batch: 24 is larger than train.global_batch (12); micro_batch must be "
            "at most global_batch");
}

TEST(JobSpecTest, NcclBackendNeedsACudaJob) {
  JobSpec spec;
  spec.name = std::string("n");
  spec.data.train = std::string("x");
  EXPECT_EQ(spec.parallel.backend, "auto");
  spec.parallel.backend = "nccl";
  EXPECT_EQ(spec.Validate().message(),
            "parallel.backend: nccl needs resources.device cuda (it is 'cpu'): NCCL moves GPU "
            "memory only; use auto or gloo");
  spec.resources.device = "cuda";
  EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();
  spec.parallel.backend = "mpi";
  EXPECT_NE(spec.Validate().message().find("parallel.backend"), std::string::npos);
}

TEST(JobSpecTest, ValidateForWorldSizeNamesEachFactor) {
  JobSpec spec;
  spec.model.n_layer = 4;
  spec.parallel.pp = 2;
  spec.parallel.tp = 4;
  spec.train.global_batch = 8;
  spec.train.micro_batch = 1;
  EXPECT_EQ(spec.ValidateForWorldSize(6).message(),
            "world_size 6 is not divisible by pp (2) x tp (4) = 8");
  EXPECT_TRUE(spec.ValidateForWorldSize(16).ok());
  EXPECT_EQ(spec.ValidateForWorldSize(24).message(),
            "train.global_batch (8) is not divisible by dp (3) x train.micro_batch (1) = 3 at "
            "world_size 24");
  spec.parallel.dp = 2;
  EXPECT_EQ(spec.ValidateForWorldSize(8).message(),
            "dp (2) x pp (2) x tp (4) = 16 does not equal world_size 8; set parallel.dp to auto "
            "or to 8 / (pp x tp)");
  EXPECT_EQ(spec.ValidateForWorldSize(0).message(), "world_size 0 must be at least 1");
}

TEST(JobSpecTest, FeasibleWorldSizesKeepTheGlobalBatch) {
  JobSpec spec;
  spec.parallel.pp = 2;
  spec.train.global_batch = 8;
  spec.train.micro_batch = 2;
  spec.resources.world_size = {1, 8};
  // dp = ws / 2 must divide 8 / 2 = 4.
  EXPECT_EQ(spec.FeasibleWorldSizes(), (std::vector<int>{2, 4, 8}));
}

TEST(JobSpecTest, LoadJobSpecFileNamesAMissingPath) {
  StatusOr<JobSpec> spec = LoadJobSpecFile("/nonexistent/dir/job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kNotFound);
  EXPECT_NE(spec.status().message().find("/nonexistent/dir/job.yaml"), std::string::npos);
}

TEST(JobSpecTest, ReadJobSpecFileSaysADirectoryIsADirectory) {
  const std::string dir = ::testing::TempDir();
  StatusOr<std::string> text = ReadJobSpecFile(dir);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(),
            "job spec '" + dir + "' is a directory, not a YAML file; give the spec file itself");
  EXPECT_EQ(LoadJobSpecFile(dir).status(), text.status());
}

TEST(JobSpecTest, ReadJobSpecFileGivesTheReasonItCannotRead) {
  StatusOr<std::string> text = ReadJobSpecFile("/nonexistent/dir/job.yaml");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(text.status().message(),
            "cannot read job spec '/nonexistent/dir/job.yaml': open /nonexistent/dir/job.yaml: "
            "No such file or directory");
}

TEST(JobSpecTest, LoadJobSpecFilePrefixesErrorsWithThePath) {
  const std::string path = ::testing::TempDir() + "/job_spec_test_bad.yaml";
  ASSERT_TRUE(WriteFileAtomic(path, Minimal("train:\n  steps: -1\n")).ok());
  StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message(),
            path + ": train.steps (line 4): -1 is out of range; must be at least 1");
  ASSERT_TRUE(RemoveAll(path).ok());
}

TEST(JobSpecTest, EveryDeployExampleIsValid) {
  StatusOr<std::vector<std::string>> paths =
      ListGlob(std::string(DROVER_SOURCE_DIR) + "/deploy/examples/*.yaml");
  ASSERT_TRUE(paths.ok()) << paths.status();
  EXPECT_GE(paths->size(), 3u);
  for (const std::string& path : *paths) {
    StatusOr<JobSpec> spec = LoadJobSpecFile(path);
    EXPECT_TRUE(spec.ok()) << spec.status();
  }
}

TEST(JobSpecTest, ShakespeareExampleIsTheDesignExample) {
  StatusOr<JobSpec> file =
      LoadJobSpecFile(std::string(DROVER_SOURCE_DIR) + "/deploy/examples/shakespeare-char.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  StatusOr<JobSpec> design = ParseJobSpec(kDesignExample);
  ASSERT_TRUE(design.ok());
  EXPECT_EQ(JobSpecToYaml(*file), JobSpecToYaml(*design));
}

// ---- bad inputs: each must fail with InvalidArgument and a message containing `expect` ----

struct BadCase {
  const char* label;
  std::string yaml;
  std::vector<std::string> overrides;
  std::string expect;
};

class BadSpecTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadSpecTest, FailsWithAHelpfulMessage) {
  const BadCase& c = GetParam();
  StatusOr<JobSpec> spec = ParseJobSpec(c.yaml, c.overrides, "spec.yaml");
  ASSERT_FALSE(spec.ok()) << "accepted:\n" << c.yaml;
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << spec.status();
  EXPECT_NE(spec.status().message().find(c.expect), std::string::npos)
      << "message: " << spec.status().message() << "\nexpected to contain: " << c.expect;
}

const BadCase kBadCases[] = {
    {"TypoInKey",
     Minimal("train:\n  stpes: 5\n"),
     {},
     "spec.yaml: unknown key 'train.stpes' (line 4); did you mean 'train.steps'?"},
    {"TypoInSection", Minimal("modle:\n  n_layer: 2\n"), {}, "did you mean 'model'?"},
    {"HellaswagWithoutEvaluation",
     Minimal(),
     {"data.hellaswag=hs.bin", "train.eval_every=0"},
     "data.hellaswag (from --set): its examples are scored only at evaluation steps, and "
     "train.eval_every is 0"},
    {"NegativeHellaswagExamples",
     Minimal(),
     {"train.hellaswag_examples=-1"},
     "train.hellaswag_examples (from --set): -1 is out of range; must be at least 0"},
    {"KeyInWrongSection",
     Minimal("train:\n  dtype: fp16\n"),
     {},
     "unknown key 'train.dtype' (line 4); did you mean 'precision.dtype'?"},
    {"UnrelatedKey",
     Minimal("train:\n  zzzzzzzz: 1\n"),
     {},
     "valid keys in train: steps, global_batch"},
    {"NotAnInteger",
     Minimal("train:\n  steps: many\n"),
     {},
     "train.steps (line 4): expected an integer, got 'many'"},
    {"FractionForInteger",
     Minimal("model:\n  n_layer: 1.5\n"),
     {},
     "model.n_layer (line 4): expected an integer, got '1.5'"},
    {"NotANumber",
     Minimal("train:\n  lr: fast\n"),
     {},
     "train.lr (line 4): expected a finite number, got 'fast'"},
    {"NotABool",
     Minimal("checkpoint:\n  async: maybe\n"),
     {},
     "checkpoint.async (line 4): expected true or false, got 'maybe'"},
    {"SectionIsScalar",
     Minimal("model: 5\n"),
     {},
     "model (line 3): expected a mapping with keys n_layer, n_head"},
    {"ListForString",
     "name: [a, b]\ndata: {train: x}\n",
     {},
     "name (line 1): expected a string, got a list"},
    {"Int32Overflow",
     Minimal("train:\n  global_batch: 99999999999\n"),
     {},
     "train.global_batch (line 4): '99999999999' is out of range for this field: allowed "
     "-2147483648 to 2147483647"},
    {"IntegerOf23Digits",
     Minimal("train:\n  steps: 12345678901234567890123\n"),
     {},
     "train.steps (line 4): '12345678901234567890123' is out of range for this field: allowed "},
    {"SecondDocument",
     Minimal("train:\n  steps: 5\n---\ntrain:\n  steps: 7\n"),
     {},
     "2 YAML documents (a second one starts at line 6"},
    {"PythonObjectTag",
     Minimal("train:\n  steps: !!python/object:os.system 5\n"),
     {},
     "unknown YAML tag 'tag:yaml.org,2002:python/object:os.system' at line 4"},
    {"LocalTag",
     Minimal("output_dir: !secret runs/x\n"),
     {},
     "unknown YAML tag '!secret' at line 3"},
    {"NegativeSeed",
     Minimal("train:\n  seed: -1\n"),
     {},
     "train.seed (line 4): expected a non-negative integer, got '-1'"},
    {"NegativeSteps",
     Minimal("train:\n  steps: -5\n"),
     {},
     "train.steps (line 4): -5 is out of range; must be at least 1"},
    {"MicroLargerThanGlobal",
     Minimal("train:\n  global_batch: 12\n  micro_batch: 16\n"),
     {},
     "train.micro_batch (line 5): 16 is larger than train.global_batch (12)"},
    {"GlobalNotMultipleOfMicro",
     Minimal("train:\n  global_batch: 12\n  micro_batch: 5\n"),
     {},
     "train.global_batch (line 4): 12 is not a multiple of train.micro_batch (5)"},
    {"GlobalNotDivisibleByDpTimesMicro",
     Minimal("train: {global_batch: 12, micro_batch: 4}\nparallel: {dp: 2}\n"
             "resources: {world_size: 2}\n"),
     {},
     "parallel.dp (line 4): train.global_batch (12) is not divisible by dp (2) x "
     "train.micro_batch (4) = 8 at world_size 2"},
    {"SeqLenLongerThanBlock",
     Minimal("train:\n  seq_len: 128\n"),
     {},
     "train.seq_len (line 4): 128 is larger than model.block_size (64)"},
    {"EmbdNotDivisibleByHeads",
     Minimal("model:\n  n_head: 3\n  n_embd: 100\n"),
     {},
     "model.n_embd (line 5): 100 is not divisible by model.n_head (3)"},
    {"WorldMinAboveMax",
     Minimal("resources:\n  world_size:\n    min: 4\n    max: 2\n"),
     {},
     "resources.world_size.min (line 5): 4 is larger than resources.world_size.max (2)"},
    {"WorldSizeNotANumber",
     Minimal("resources:\n  world_size: lots\n"),
     {},
     "resources.world_size (line 4): expected an integer or {min: N, max: M}, got 'lots'"},
    {"ZeroStageOutOfRange",
     Minimal("parallel:\n  zero_stage: 4\n"),
     {},
     "parallel.zero_stage (line 4): 4 is not valid; must be 0, 1, 2 or 3"},
    {"DpShardWithoutZero",
     Minimal("parallel:\n  zero_stage: 0\n  dp_shard: 2\n"),
     {},
     "parallel.dp_shard (line 5): 2 shards ZeRO's state, and parallel.zero_stage is 0 (nothing "
     "sharded); set zero_stage 1, 2 or 3, or dp_shard 'all'"},
    {"DpShardNotDividingDp",
     Minimal("parallel:\n  zero_stage: 3\n  dp: 6\n  dp_shard: 4\n"),
     {},
     "parallel.dp_shard (line 6): 4 does not divide parallel.dp (6); the dp ranks form dp / "
     "dp_shard replicas of dp_shard ranks each"},
    {"DpShardNotACount",
     Minimal("parallel:\n  zero_stage: 3\n  dp_shard: node\n"),
     {},
     "parallel.dp_shard (line 5): expected 'all' or a positive integer, got 'node'"},
    {"UnknownDtype",
     Minimal("precision:\n  dtype: fp8\n"),
     {},
     "precision.dtype (line 4): 'fp8' is not valid; must be one of fp32, bf16, fp16"},
    {"FixedLossScaleWithoutFp16",
     Minimal("precision:\n  loss_scale: 1024\n"),
     {},
     "precision.loss_scale (line 4): a fixed scale (1024) applies only to precision.dtype fp16, "
     "not fp32"},
    {"BadLossScale",
     Minimal("precision:\n  loss_scale: lots\n"),
     {},
     "precision.loss_scale (line 4): 'lots' is not valid; must be 'dynamic' or a positive number"},
    {"UnknownSchedule",
     Minimal("train:\n  schedule: cosin\n"),
     {},
     "train.schedule (line 4): 'cosin' is not valid; must be one of cosine, linear, constant, "
     "wsd"},
    {"WsdDecayOfNoSteps",
     Minimal("train:\n  schedule: wsd\n  decay_fraction: 0\n"),
     {},
     "train.decay_fraction (line 5): 0.0 is not in (0, 1]: the share of train.steps over which "
     "schedule wsd decays the learning rate"},
    {"WsdDecayOfMoreThanEveryStep",
     Minimal("train:\n  schedule: wsd\n"),
     {"train.decay_fraction=1.5"},
     "train.decay_fraction (from --set): 1.5 is not in (0, 1]"},
    {"MinLrAboveLr",
     Minimal("train:\n  lr: 0.001\n  min_lr: 0.01\n"),
     {},
     "train.min_lr (line 5): 0.01 is larger than train.lr (0.001)"},
    {"Beta2NotBelowOne",
     Minimal("train:\n  beta2: 1.0\n"),
     {},
     "train.beta2 (line 4): 1.0 is out of range; must be in [0, 1)"},
    {"TpDoesNotDivideHeads",
     Minimal("parallel:\n  tp: 3\n"),
     {},
     "parallel.tp (line 4): 3 does not divide model.n_head (4)"},
    {"PpDoesNotDivideLayers",
     Minimal("parallel:\n  pp: 3\n"),
     {},
     "parallel.pp (line 4): 3 does not divide model.n_layer (4)"},
    {"PpLayersOfAnotherCount",
     Minimal("parallel:\n  pp: 2\n  pp_layers: [1, 1, 2]\n"),
     {},
     "parallel.pp_layers (line 5): 3 entries for parallel.pp (2); give one layer count per stage"},
    {"PpLayersWithAnEmptyStage",
     Minimal("parallel:\n  pp: 2\n"),
     {"parallel.pp_layers=4,0"},
     "parallel.pp_layers (from --set): a stage of 0 layers; each needs at least 1"},
    {"PpLayersOfAnotherSum",
     Minimal("parallel:\n  pp: 2\n  pp_layers: [3, 2]\n"),
     {},
     "parallel.pp_layers (line 5): adds up to 5 layers, but model.n_layer is 4"},
    {"PpLayersNotCounts",
     Minimal("parallel:\n  pp: 2\n  pp_layers: [3, x]\n"),
     {},
     "parallel.pp_layers (line 5): expected a list of layer counts, got 'x'"},
    {"RecomputeMoreLayersThanTheModelHas",
     Minimal("train:\n  recompute: 5\n"),
     {},
     "train.recompute (line 4): 5 layers, but model.n_layer is 4; give at most n_layer"},
    {"RecomputeNotACount",
     Minimal(""),
     {"train.recompute=some"},
     "train.recompute (from --set): expected 'none', 'all' or a count of layers, got 'some'"},
    {"PpChunksWithoutTheInterleavedSchedule",
     Minimal("parallel:\n  pp: 2\n  pp_chunks: 2\n"),
     {},
     "parallel.pp_chunks (line 5): 2 needs parallel.pp_schedule interleaved (it is '1f1b'): only "
     "the interleaved schedule runs several chunks per stage"},
    {"InterleavedWithOneChunk",
     Minimal("parallel:\n  pp: 2\n  pp_schedule: interleaved\n  pp_chunks: 1\n"),
     {},
     "parallel.pp_chunks (line 6): 1 with parallel.pp_schedule interleaved: interleaving needs at "
     "least 2 chunks per stage (use 1f1b for one)"},
    {"InterleavedWithoutAPipeline",
     Minimal("parallel:\n  pp_schedule: interleaved\n"),
     {},
     "parallel.pp_schedule (line 4): interleaved needs parallel.pp of at least 2 (it is 1): there "
     "are no stages to interleave"},
    {"InterleavedVirtualStagesDoNotDivideLayers",
     Minimal("parallel:\n  pp: 2\n  pp_schedule: interleaved\n  pp_chunks: 4\n"),
     {},
     "parallel.pp_chunks (line 6): 4 chunks on each of parallel.pp (2) stages are 8 virtual "
     "stages, which do not divide model.n_layer (4)"},
    {"InterleavedPpLayersPerStage",
     Minimal("parallel:\n  pp: 2\n  pp_schedule: interleaved\n  pp_layers: [3, 1]\n"),
     {},
     "parallel.pp_layers (line 6): 2 entries for parallel.pp (2) x parallel.pp_chunks (2) = 4 "
     "virtual stages; give one layer count per virtual stage"},
    {"InterleavedMicroBatchesNotAMultipleOfPp",
     Minimal("parallel: {pp: 2, pp_schedule: interleaved}\ntrain: {global_batch: 6, "
             "micro_batch: 2}\nresources: {world_size: 2}\n"),
     {},
     "= 3 at world_size 2, to be a multiple of pp (2)"},
    {"PpChunksZero",
     Minimal("parallel:\n  pp_chunks: 0\n"),
     {},
     "parallel.pp_chunks (line 4): expected 'auto' or a positive integer, got '0'"},
    {"DpZero",
     Minimal("parallel:\n  dp: 0\n"),
     {},
     "parallel.dp (line 4): expected 'auto' or a positive integer, got '0'"},
    {"WorldSizeDoesNotFitLayout",
     Minimal("parallel: {pp: 2, tp: 4}\nresources: {world_size: 6}\n"),
     {},
     "resources.world_size (line 4): world_size 6 is not divisible by pp (2) x tp (4) = 8"},
    {"NoWorldSizeInRangeFits",
     Minimal("parallel: {pp: 2, tp: 4}\nresources: {world_size: {min: 2, max: 7}}\n"),
     {},
     "no world size in [2, 7] fits the parallel layout: world_size 2 is not divisible"},
    {"ExplicitDpMismatch",
     Minimal("parallel: {dp: 2}\nresources: {world_size: 4}\n"),
     {},
     "dp (2) x pp (1) x tp (1) = 2 does not equal world_size 4"},
    {"UnknownDevice",
     Minimal("resources:\n  device: tpu\n"),
     {},
     "resources.device (line 4): 'tpu' is not valid; must be one of cpu, cuda"},
    {"SpikeFactorNotAboveOne",
     Minimal("fault_tolerance:\n  spike_rollback: {enabled: true, factor: 1}\n"),
     {},
     "fault_tolerance.spike_rollback.factor (line 4): 1.0 is out of range; must be greater than 1"},
    {"StragglerFactorNotAboveOne",
     Minimal("fault_tolerance:\n  straggler_factor: 0.9\n"),
     {},
     "fault_tolerance.straggler_factor (line 4): 0.9 is out of range; must be greater than 1"},
    {"NegativeStragglerReplacement",
     Minimal("fault_tolerance:\n  replace_stragglers_after_s: -5\n"),
     {},
     "fault_tolerance.replace_stragglers_after_s (line 4): -5.0 is out of range; must be a "
     "number at least 0"},
    {"StragglerReplacementWithoutCheckpoints",
     Minimal("fault_tolerance: {replace_stragglers_after_s: 300}\ncheckpoint: {every_steps: 0}\n"),
     {},
     "fault_tolerance.replace_stragglers_after_s (line 3): 300.0 needs checkpoints: a straggler "
     "is replaced at a checkpoint, and checkpoint.every_steps and checkpoint.every_minutes are "
     "0"},
    {"NegativeCheckpointMinutes",
     Minimal("checkpoint: {every_minutes: -1}\n"),
     {},
     "checkpoint.every_minutes (line 3): -1.0 is out of range; must be a number at least 0"},
    {"NegativeTimeLimit",
     Minimal("resources: {time_limit_minutes: -5}\n"),
     {},
     "resources.time_limit_minutes (line 3): -5.0 is out of range; must be between 0 (no limit) "
     "and 525600 (a year)"},
    {"TimeLimitOverAYear",
     Minimal(""),
     {"resources.time_limit_minutes=1e9"},
     "resources.time_limit_minutes (from --set): 1.0e+09 is out of range; must be between 0 "
     "(no limit) and 525600 (a year)"},
    {"MissingTrainData", "name: t\n", {}, "spec.yaml: data.train: is required"},
    {"MissingName", "data: {train: x}\n", {}, "spec.yaml: name: is required"},
    {"NameWithSpace",
     "name: my job\ndata: {train: x}\n",
     {},
     "name (line 1): 'my job' contains ' '"},
    {"NameEscapingRuns", "name: ..\ndata: {train: x}\n", {}, "'..' is not a valid name"},
    {"DuplicateKey",
     Minimal("train:\n  steps: 1\n  steps: 2\n"),
     {},
     "duplicate key 'train.steps' (line 5); it is already set at line 4"},
    {"MalformedYaml",
     Minimal("train:\n  steps: [1, 2\n  lr: 3\n"),
     {},
     "spec.yaml: invalid YAML at line 5, column"},
    {"BadIndentation", "name: t\n  data: x\n", {}, "spec.yaml: invalid YAML at line 2"},
    {"TopLevelList",
     "- a\n- b\n",
     {},
     "expected a mapping of sections at the top level, got a list"},
    {"EmptySpec", "", {}, "the job spec is empty"},
    {"OverrideTypo",
     Minimal(),
     {"train.stpes=3"},
     "--set 'train.stpes=3': unknown key 'train.stpes'; did you mean 'train.steps'?"},
    {"OverrideSectionTypo", Minimal(), {"trian.steps=3"}, "did you mean 'train.steps'?"},
    {"OverrideOfASection", Minimal(), {"train.=3"}, "unknown key 'train.'; valid keys in train"},
    {"OverrideWithoutEquals",
     Minimal(),
     {"train.steps"},
     "--set 'train.steps': expected section.key=value"},
    {"OverrideBadValue",
     Minimal(),
     {"train.steps=x"},
     "train.steps (from --set): expected an integer, got 'x'"},
    {"OverrideThroughScalar",
     Minimal("model: 5\n"),
     {"model.n_layer=2"},
     "--set 'model.n_layer=2': 'model' in the spec is not a mapping but '5'"},
};

INSTANTIATE_TEST_SUITE_P(Table, BadSpecTest, ::testing::ValuesIn(kBadCases),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return std::string(info.param.label);
                         });

}  // namespace
}  // namespace drover
