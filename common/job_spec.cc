// Decoding (YAML -> JobSpec), --set overrides and serialization. The rules that check a
// decoded spec are in job_spec_validate.cc.
#include "common/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <utility>

#include "common/files.h"
#include "common/job_spec_internal.h"
#include "common/yaml_util.h"

namespace drover {
namespace spec_internal {

std::string SourceMap::Where(const std::string& path) const {
  // An override of a section ("resources.world_size=4") covers every key under it.
  for (std::string p = path;;) {
    if (overrides_.count(p) != 0) return " (from --set)";
    const size_t dot = p.rfind('.');
    if (dot == std::string::npos) break;
    p.resize(dot);
  }
  const auto it = lines_.find(path);
  return it == lines_.end() ? "" : " (line " + std::to_string(it->second) + ")";
}

}  // namespace spec_internal

namespace {

using spec_internal::SourceMap;
using yaml_util::Describe;
using yaml_util::LineOf;

// One key of the spec: its dotted path and how to read and write it.
struct Field {
  std::string path;
  // Returns InvalidArgument with only the problem; the caller adds path and line.
  std::function<Status(const YAML::Node&, JobSpec*)> decode;
  std::function<void(const JobSpec&, YAML::Emitter*)> emit;
};

void EmitValue(int v, YAML::Emitter* out) { *out << v; }
void EmitValue(int64_t v, YAML::Emitter* out) { *out << v; }
void EmitValue(uint64_t v, YAML::Emitter* out) { *out << v; }
void EmitValue(double v, YAML::Emitter* out) { *out << yaml_util::FormatDouble(v); }
void EmitValue(bool v, YAML::Emitter* out) { *out << (v ? "true" : "false"); }
void EmitValue(const std::string& v, YAML::Emitter* out) { *out << v; }

template <typename Get>
Field MakeField(const char* path, Get get) {
  return {path,
          [get](const YAML::Node& node, JobSpec* spec) {
            return yaml_util::DecodeScalar(node, get(*spec));
          },
          [get](const JobSpec& spec, YAML::Emitter* out) { EmitValue(*get(spec), out); }};
}

// A key's YAML path is exactly its member path in JobSpec, so one macro spells both and
// they cannot drift apart.
#define DROVER_SPEC_FIELD(member) MakeField(#member, [](auto& s) { return &s.member; })

// A word meaning 0 ('auto', 'all') or a positive integer, for the keys that take either.
Status DecodeWordOrCount(const YAML::Node& node, const std::string& word, int* out) {
  if (node.IsScalar() && node.Scalar() == word) {
    *out = 0;
    return OkStatus();
  }
  int64_t v = 0;
  if (!node.IsScalar() || !yaml_util::ParseInt64(node.Scalar(), &v) || v < 1 || v > (1 << 20)) {
    return InvalidArgumentError("expected '" + word + "' or a positive integer, got " +
                                Describe(node));
  }
  *out = static_cast<int>(v);
  return OkStatus();
}

void EmitWordOrCount(int v, const std::string& word, YAML::Emitter* out) {
  if (v == 0) {
    *out << word;
  } else {
    *out << v;
  }
}

Status DecodeDp(const YAML::Node& node, JobSpec* spec) {
  return DecodeWordOrCount(node, "auto", &spec->parallel.dp);
}
void EmitDp(const JobSpec& spec, YAML::Emitter* out) {
  EmitWordOrCount(spec.parallel.dp, "auto", out);
}

// parallel.dp_shard: 'all' (ZeRO shards over every dp rank) or a count of dp ranks.
Status DecodeDpShard(const YAML::Node& node, JobSpec* spec) {
  return DecodeWordOrCount(node, "all", &spec->parallel.dp_shard);
}
void EmitDpShard(const JobSpec& spec, YAML::Emitter* out) {
  EmitWordOrCount(spec.parallel.dp_shard, "all", out);
}

// parallel.pp_chunks: 'auto' (2 under the interleaved schedule, else 1) or a count.
Status DecodePpChunks(const YAML::Node& node, JobSpec* spec) {
  return DecodeWordOrCount(node, "auto", &spec->parallel.pp_chunks);
}
void EmitPpChunks(const JobSpec& spec, YAML::Emitter* out) {
  EmitWordOrCount(spec.parallel.pp_chunks, "auto", out);
}

// train.recompute: 'none', 'all' or a count of layers (checked against model.n_layer by
// Validate).
Status DecodeRecompute(const YAML::Node& node, JobSpec* spec) {
  if (node.IsScalar() && node.Scalar() == "none") {
    spec->train.recompute = 0;
    return OkStatus();
  }
  if (node.IsScalar() && node.Scalar() == "all") {
    spec->train.recompute = TrainSpec::kRecomputeAll;
    return OkStatus();
  }
  int64_t v = 0;
  if (!node.IsScalar() || !yaml_util::ParseInt64(node.Scalar(), &v) || v < 0 || v > (1 << 20)) {
    return InvalidArgumentError("expected 'none', 'all' or a count of layers, got " +
                                Describe(node));
  }
  spec->train.recompute = static_cast<int>(v);
  return OkStatus();
}

void EmitRecompute(const JobSpec& spec, YAML::Emitter* out) {
  const int n = spec.train.recompute;
  if (n == 0) {
    *out << "none";
  } else if (n == TrainSpec::kRecomputeAll) {
    *out << "all";
  } else {
    *out << n;
  }
}

// The value ("dynamic" or a number) is checked by Validate, together with the dtype.
Status DecodeLossScale(const YAML::Node& node, JobSpec* spec) {
  if (!node.IsScalar()) {
    return InvalidArgumentError("expected 'dynamic' or a positive number, got " + Describe(node));
  }
  spec->precision.loss_scale = node.Scalar();
  return OkStatus();
}

void EmitLossScale(const JobSpec& spec, YAML::Emitter* out) { *out << spec.precision.loss_scale; }

// A list of layer counts: a YAML sequence ([7, 5]), or the same as one scalar ("7,5" or
// "[7,5]", as --set hands it over); empty or [] for the even split. Counts and their sum are
// checked by Validate, against pp and n_layer.
Status DecodePpLayers(const YAML::Node& node, JobSpec* spec) {
  std::vector<std::string> items;
  if (node.IsSequence()) {
    for (const YAML::Node& item : node) {
      if (!item.IsScalar()) {
        return InvalidArgumentError("expected a list of layer counts, got " + Describe(node));
      }
      items.push_back(item.Scalar());
    }
  } else if (node.IsScalar() || node.IsNull()) {
    std::string_view text = node.IsNull() ? std::string_view() : std::string_view(node.Scalar());
    if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
      text = text.substr(1, text.size() - 2);
    }
    while (text.find_first_not_of(' ') != std::string_view::npos) {
      const size_t comma = text.find(',');
      items.emplace_back(text.substr(0, comma));  // to the end when there is none
      if (comma == std::string_view::npos) break;
      text.remove_prefix(comma + 1);
    }
  } else {
    return InvalidArgumentError("expected a list of layer counts, got " + Describe(node));
  }
  std::vector<int> layers;
  for (const std::string& raw : items) {
    const size_t b = raw.find_first_not_of(' '), e = raw.find_last_not_of(' ');
    const std::string item = b == std::string::npos ? "" : raw.substr(b, e - b + 1);
    int64_t v = 0;
    if (!yaml_util::ParseInt64(item, &v) || v < 0 || v > (1 << 20)) {
      return InvalidArgumentError("expected a list of layer counts, got '" + item + "' in " +
                                  Describe(node));
    }
    layers.push_back(static_cast<int>(v));
  }
  spec->parallel.pp_layers = std::move(layers);
  return OkStatus();
}

void EmitPpLayers(const JobSpec& spec, YAML::Emitter* out) {
  *out << YAML::Flow << YAML::BeginSeq;
  for (int n : spec.parallel.pp_layers) *out << n;
  *out << YAML::EndSeq;
}

// Every key in DESIGN.md order; keys of one section are contiguous (JobSpecToYaml relies
// on it).
const std::vector<Field>& Fields() {
  static const auto* const fields = new std::vector<Field>{
      DROVER_SPEC_FIELD(name),
      DROVER_SPEC_FIELD(output_dir),
      DROVER_SPEC_FIELD(model.n_layer),
      DROVER_SPEC_FIELD(model.n_head),
      DROVER_SPEC_FIELD(model.n_embd),
      DROVER_SPEC_FIELD(model.block_size),
      DROVER_SPEC_FIELD(model.vocab_size),
      DROVER_SPEC_FIELD(data.train),
      DROVER_SPEC_FIELD(data.val),
      DROVER_SPEC_FIELD(data.hellaswag),
      DROVER_SPEC_FIELD(train.steps),
      DROVER_SPEC_FIELD(train.global_batch),
      DROVER_SPEC_FIELD(train.micro_batch),
      DROVER_SPEC_FIELD(train.seq_len),
      DROVER_SPEC_FIELD(train.lr),
      DROVER_SPEC_FIELD(train.min_lr),
      DROVER_SPEC_FIELD(train.warmup_steps),
      DROVER_SPEC_FIELD(train.schedule),
      DROVER_SPEC_FIELD(train.decay_fraction),
      DROVER_SPEC_FIELD(train.weight_decay),
      DROVER_SPEC_FIELD(train.beta1),
      DROVER_SPEC_FIELD(train.beta2),
      DROVER_SPEC_FIELD(train.eps),
      DROVER_SPEC_FIELD(train.grad_clip),
      DROVER_SPEC_FIELD(train.seed),
      DROVER_SPEC_FIELD(train.eval_every),
      DROVER_SPEC_FIELD(train.eval_batches),
      DROVER_SPEC_FIELD(train.hellaswag_examples),
      DROVER_SPEC_FIELD(train.init_from),
      DROVER_SPEC_FIELD(train.log_every),
      Field{"train.recompute", DecodeRecompute, EmitRecompute},
      DROVER_SPEC_FIELD(precision.dtype),
      Field{"precision.loss_scale", DecodeLossScale, EmitLossScale},
      DROVER_SPEC_FIELD(precision.initial_loss_scale),
      DROVER_SPEC_FIELD(precision.loss_scale_window),
      Field{"parallel.dp", DecodeDp, EmitDp},
      DROVER_SPEC_FIELD(parallel.pp),
      DROVER_SPEC_FIELD(parallel.tp),
      DROVER_SPEC_FIELD(parallel.zero_stage),
      Field{"parallel.dp_shard", DecodeDpShard, EmitDpShard},
      DROVER_SPEC_FIELD(parallel.pp_schedule),
      Field{"parallel.pp_chunks", DecodePpChunks, EmitPpChunks},
      Field{"parallel.pp_layers", DecodePpLayers, EmitPpLayers},
      DROVER_SPEC_FIELD(parallel.timeout_s),
      DROVER_SPEC_FIELD(parallel.bucket_mb),
      DROVER_SPEC_FIELD(parallel.backend),
      DROVER_SPEC_FIELD(parallel.stream_order),
      DROVER_SPEC_FIELD(resources.device),
      DROVER_SPEC_FIELD(resources.world_size.min),
      DROVER_SPEC_FIELD(resources.world_size.max),
      DROVER_SPEC_FIELD(resources.threads_per_rank),
      DROVER_SPEC_FIELD(resources.time_limit_minutes),
      DROVER_SPEC_FIELD(checkpoint.dir),
      DROVER_SPEC_FIELD(checkpoint.every_steps),
      DROVER_SPEC_FIELD(checkpoint.every_minutes),
      DROVER_SPEC_FIELD(checkpoint.keep_last),
      DROVER_SPEC_FIELD(checkpoint.async),
      DROVER_SPEC_FIELD(fault_tolerance.max_restarts),
      DROVER_SPEC_FIELD(fault_tolerance.hang_timeout_s),
      DROVER_SPEC_FIELD(fault_tolerance.spike_rollback.enabled),
      DROVER_SPEC_FIELD(fault_tolerance.spike_rollback.factor),
      DROVER_SPEC_FIELD(fault_tolerance.spike_rollback.window),
      DROVER_SPEC_FIELD(fault_tolerance.spike_rollback.skip_steps),
      DROVER_SPEC_FIELD(fault_tolerance.straggler_factor),
      DROVER_SPEC_FIELD(fault_tolerance.replace_stragglers_after_s),
  };
  return *fields;
}

#undef DROVER_SPEC_FIELD

constexpr char kWorldSize[] = "resources.world_size";

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot; (dot = path.find('.', start)) != std::string::npos; start = dot + 1) {
    parts.push_back(path.substr(start, dot - start));
  }
  parts.push_back(path.substr(start));
  return parts;
}

std::string JoinPath(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

// The schema as a tree: for each section path ("" is the top level), its keys in order.
struct Schema {
  std::map<std::string, const Field*> fields;
  std::map<std::string, std::vector<std::string>> children;
};

const Schema& GetSchema() {
  static const Schema* const schema = [] {
    auto* s = new Schema;
    for (const Field& f : Fields()) {
      s->fields[f.path] = &f;
      std::string prefix;
      for (const std::string& part : SplitPath(f.path)) {
        std::vector<std::string>& keys = s->children[prefix];
        if (std::find(keys.begin(), keys.end(), part) == keys.end()) keys.push_back(part);
        prefix = JoinPath(prefix, part);
      }
    }
    return s;
  }();
  return *schema;
}

bool IsSection(const std::string& path) { return GetSchema().children.count(path) != 0; }
bool IsKnown(const std::string& path) {
  return IsSection(path) || GetSchema().fields.count(path) != 0;
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// "; did you mean 'train.steps'?" when a known path is one typo (per component) away, or
// the same key exists in another section; otherwise the keys valid where it went wrong.
std::string SuggestFor(const std::string& path) {
  const Schema& schema = GetSchema();
  const std::vector<std::string> parts = SplitPath(path);
  std::string known;      // longest valid prefix as written
  std::string corrected;  // path with each bad component replaced by its closest key
  bool correctable = true;
  for (const std::string& part : parts) {
    const std::string as_written = JoinPath(known, part);
    if (correctable && known == corrected && IsKnown(as_written)) {
      known = corrected = as_written;
      continue;
    }
    const auto keys = schema.children.find(corrected);
    const std::string guess =
        keys == schema.children.end() ? "" : yaml_util::ClosestMatch(part, keys->second);
    if (guess.empty()) {
      correctable = false;
      break;
    }
    corrected = JoinPath(corrected, guess);
  }
  if (correctable && IsKnown(corrected) && corrected != path) {
    return "; did you mean '" + corrected + "'?";
  }
  for (const auto& [field_path, field] : schema.fields) {
    if (SplitPath(field_path).back() == parts.back()) {
      return "; did you mean '" + field_path + "'?";
    }
  }
  const auto keys = schema.children.find(known);
  if (keys == schema.children.end()) return "";
  return "; valid keys " + (known.empty() ? "at the top level" : "in " + known) + ": " +
         Join(keys->second);
}

Status UnknownKey(const std::string& path, int line) {
  return InvalidArgumentError("unknown key '" + path + "'" +
                              (line > 0 ? " (line " + std::to_string(line) + ")" : "") +
                              SuggestFor(path));
}

// Walks the YAML tree against the schema, filling a JobSpec and the line of every key.
class Decoder {
 public:
  explicit Decoder(SourceMap* sources) : sources_(sources) {}

  Status Decode(const YAML::Node& root, JobSpec* spec) {
    if (!root.IsDefined() || root.IsNull()) {
      return InvalidArgumentError("the job spec is empty; it needs at least name and data.train");
    }
    if (!root.IsMap()) {
      return InvalidArgumentError("expected a mapping of sections at the top level, got " +
                                  Describe(root));
    }
    return DecodeMap(root, "", spec);
  }

 private:
  Status Fail(const std::string& path, const Status& problem) const {
    return InvalidArgumentError(path + sources_->Where(path) + ": " + problem.message());
  }

  Status DecodeMap(const YAML::Node& map, const std::string& prefix, JobSpec* spec) {
    std::map<std::string, int> seen;  // key -> line, to reject duplicates
    for (const auto& kv : map) {
      const int line = LineOf(kv.first);
      if (!kv.first.IsScalar()) {
        return InvalidArgumentError(
            "a key" + (line > 0 ? " at line " + std::to_string(line) : "") +
            (prefix.empty() ? " at the top level" : " in '" + prefix + "'") +
            " is not a plain name but " + Describe(kv.first));
      }
      const std::string path = JoinPath(prefix, kv.first.Scalar());
      if (const auto [it, inserted] = seen.emplace(path, line); !inserted) {
        return InvalidArgumentError("duplicate key '" + path + "' (line " + std::to_string(line) +
                                    "); it is already set at line " + std::to_string(it->second));
      }
      sources_->SetLine(path, line);
      RETURN_IF_ERROR(DecodeValue(path, kv.second, line, spec));
    }
    return OkStatus();
  }

  Status DecodeValue(const std::string& path, const YAML::Node& value, int line, JobSpec* spec) {
    const Schema& schema = GetSchema();
    if (const auto field = schema.fields.find(path); field != schema.fields.end()) {
      Status st = field->second->decode(value, spec);
      return st.ok() ? st : Fail(path, st);
    }
    if (!IsSection(path)) return UnknownKey(path, line);
    if (value.IsNull()) return OkStatus();  // "checkpoint:" with nothing under it: defaults
    if (value.IsMap()) return DecodeMap(value, path, spec);
    if (path == kWorldSize && value.IsScalar()) {
      // A plain N means a fixed world size: {min: N, max: N}.
      int n = 0;
      Status st = yaml_util::DecodeScalar(value, &n);
      if (!st.ok()) {
        return Fail(path, InvalidArgumentError("expected an integer or {min: N, max: M}, got " +
                                               Describe(value)));
      }
      spec->resources.world_size = {n, n};
      sources_->SetLine(path + ".min", line);
      sources_->SetLine(path + ".max", line);
      return OkStatus();
    }
    return Fail(path,
                InvalidArgumentError("expected a mapping with keys " +
                                     Join(schema.children.at(path)) + ", got " + Describe(value)));
  }

  SourceMap* sources_;
};

// Sets `path` in the tree to the YAML scalar `text`, creating sections as needed.
Status ApplyOneOverride(const std::string& arg, YAML::Node* root, SourceMap* sources) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgumentError("--set '" + arg + "': expected section.key=value, e.g. " +
                                "train.steps=100");
  }
  const std::string path = arg.substr(0, eq);
  const std::string text = arg.substr(eq + 1);
  if (!IsKnown(path) || path.empty()) {
    return InvalidArgumentError("--set '" + arg + "': " + UnknownKey(path, 0).message());
  }
  // Every key holds a scalar, so a value that does not parse as one (a glob starting with
  // '*', which YAML reads as an alias; "a: b") is taken literally, as a string, and the
  // field's decoder judges it. Only sections (world_size) take a flow mapping.
  YAML::Node value;
  const bool parsed = yaml_util::Parse(text, &value).ok();
  if (!parsed || (!IsSection(path) && !value.IsScalar() && !value.IsNull())) {
    value = YAML::Node(text);
  }

  const std::vector<std::string> parts = SplitPath(path);
  YAML::Node node = *root;
  std::string prefix;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    prefix = JoinPath(prefix, parts[i]);
    YAML::Node child = node[parts[i]];
    if (!child.IsDefined() || child.IsNull()) {
      node[parts[i]] = YAML::Node(YAML::NodeType::Map);
    } else if (prefix == kWorldSize && child.IsScalar()) {
      YAML::Node expanded(YAML::NodeType::Map);  // world_size: N is {min: N, max: N}
      expanded["min"] = child.Scalar();
      expanded["max"] = child.Scalar();
      node[parts[i]] = expanded;
    } else if (!child.IsMap()) {
      return InvalidArgumentError("--set '" + arg + "': '" + prefix +
                                  "' in the spec is not a mapping but " + Describe(child));
    }
    YAML::Node next = node[parts[i]];
    node.reset(next);  // rebinds; plain assignment would overwrite the node's contents
  }
  node[parts.back()] = value;
  sources->MarkOverride(path);
  return OkStatus();
}

// Parses the text and applies every override in order.
Status LoadTree(const std::string& yaml_text, const std::vector<std::string>& overrides,
                const std::string& source_name, YAML::Node* root, SourceMap* sources) {
  Status st = yaml_util::Parse(yaml_text, root);
  if (!st.ok()) return st.WithContext(source_name);
  if (overrides.empty()) return OkStatus();
  if (!root->IsDefined() || root->IsNull()) {
    *root = YAML::Node(YAML::NodeType::Map);
  } else if (!root->IsMap()) {
    return InvalidArgumentError("expected a mapping of sections at the top level, got " +
                                Describe(*root))
        .WithContext(source_name);
  }
  for (const std::string& arg : overrides) RETURN_IF_ERROR(ApplyOneOverride(arg, root, sources));
  return OkStatus();
}

// Defaults that depend on other fields; the rest live in job_spec.h.
void FillDerivedDefaults(JobSpec* spec) {
  if (spec->output_dir.empty()) spec->output_dir = "runs/" + spec->name;
  if (spec->checkpoint.dir.empty()) spec->checkpoint.dir = spec->output_dir + "/ckpt";
}

}  // namespace

StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text,
                               const std::vector<std::string>& overrides,
                               const std::string& source_name) {
  SourceMap sources;
  YAML::Node root;
  RETURN_IF_ERROR(LoadTree(yaml_text, overrides, source_name, &root, &sources));
  JobSpec spec;
  Status st = Decoder(&sources).Decode(root, &spec);
  if (!st.ok()) return st.WithContext(source_name);
  FillDerivedDefaults(&spec);
  st = spec_internal::ValidateSpec(spec, sources);
  if (!st.ok()) return st.WithContext(source_name);
  return spec;
}

StatusOr<std::string> ReadJobSpecFile(const std::string& path) {
  // Checked first: reading a directory fails with EISDIR on Linux, but as an empty file
  // on some systems, which would then be "the job spec is empty".
  if (IsDirectory(path)) {
    return InvalidArgumentError("job spec '" + path +
                                "' is a directory, not a YAML file; give the spec file itself");
  }
  StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status().WithContext("cannot read job spec '" + path + "'");
  return text;
}

StatusOr<JobSpec> LoadJobSpecFile(const std::string& path,
                                  const std::vector<std::string>& overrides) {
  ASSIGN_OR_RETURN(std::string text, ReadJobSpecFile(path));
  return ParseJobSpec(text, overrides, path);
}

StatusOr<std::string> ApplyOverrides(const std::string& yaml_text,
                                     const std::vector<std::string>& overrides,
                                     const std::string& source_name) {
  const StatusOr<JobSpec> parsed = ParseJobSpec(yaml_text, overrides, source_name);
  if (!parsed.ok()) return parsed.status();
  if (overrides.empty()) return yaml_text;  // keeps the author's comments and layout
  SourceMap sources;
  YAML::Node root;
  RETURN_IF_ERROR(LoadTree(yaml_text, overrides, source_name, &root, &sources));
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

std::string JobSpecToYaml(const JobSpec& spec) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open;  // the sections currently open, outermost first
  for (const Field& field : Fields()) {
    std::vector<std::string> parts = SplitPath(field.path);
    const std::string key = parts.back();
    parts.pop_back();
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) {
      ++common;
    }
    for (; open.size() > common; open.pop_back()) out << YAML::EndMap;
    for (size_t i = common; i < parts.size(); ++i) {
      out << YAML::Key << parts[i] << YAML::Value << YAML::BeginMap;
      open.push_back(parts[i]);
    }
    out << YAML::Key << key << YAML::Value;
    field.emit(spec, &out);
  }
  for (; !open.empty(); open.pop_back()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace drover
