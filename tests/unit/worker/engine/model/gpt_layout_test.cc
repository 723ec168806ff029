// GptLayout: what each rank of a pipeline / tensor-parallel mesh holds, and the mapping
// between its local arena and the global one.
#include "worker/engine/model/gpt_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace drover::engine {
namespace {

GptConfig Config() { return GptConfig{16, 50, 128, 4, 4, 16}; }  // maxT V Vp L NH C

// Units tile the local arena in order, and tensors tile the units.
void ExpectUnitsTileTheArena(const GptLayout& layout) {
  size_t offset = 0;
  for (const Unit& u : layout.units()) {
    EXPECT_EQ(u.offset, offset);
    offset += u.numel;
  }
  EXPECT_EQ(offset, layout.num_params());
  offset = 0;
  for (const LocalTensor& t : layout.tensors()) {
    EXPECT_EQ(t.offset, offset) << layout.NameOf(t);
    offset += t.numel;
  }
  EXPECT_EQ(offset, layout.num_params());
}

TEST(GptLayoutTest, WholeModelIsTheGlobalArena) {
  const GptLayout layout = GptLayout::Whole(Config());
  ASSERT_EQ(layout.num_params(), GptNumParams(Config()));
  ASSERT_EQ(layout.tensors().size(), layout.global_tensors().size());
  for (size_t i = 0; i < layout.tensors().size(); ++i) {
    EXPECT_EQ(layout.tensors()[i].offset, layout.global_tensors()[i].offset);
    EXPECT_TRUE(layout.tensors()[i].primary);
  }
  EXPECT_EQ(layout.head_unit(), layout.embedding_unit());
  EXPECT_EQ(layout.units().size(), 4u + 2u);  // embedding, 4 layers, final norm
  ExpectUnitsTileTheArena(layout);
}

TEST(GptLayoutTest, EveryGlobalElementHasExactlyOnePrimaryOwner) {
  const GptConfig cfg = Config();
  const size_t n = GptNumParams(cfg);
  std::vector<float> global(n);
  std::iota(global.begin(), global.end(), 0.0f);  // every element distinct
  std::vector<int> owners(n, 0);
  // (stages, chunks): pipelines of 1, 2 and 4 stages, and 2 stages of 2 chunks each.
  for (auto [stages, chunks] : {std::pair{1, 1}, {2, 1}, {4, 1}, {2, 2}}) {
    for (int tp : {1, 2, 4}) {
      std::fill(owners.begin(), owners.end(), 0);
      std::vector<float> rebuilt(n, -1.0f);
      for (int stage = 0; stage < stages; ++stage) {
        for (int r = 0; r < tp; ++r) {
          auto layout = GptLayout::Create(cfg, stage, stages, r, tp, {}, chunks);
          ASSERT_TRUE(layout.ok()) << layout.status();
          ExpectUnitsTileTheArena(*layout);
          std::vector<float> local(layout->num_params());
          layout->GlobalToLocal(global.data(), local.data());
          layout->LocalToGlobal(local.data(), rebuilt.data(), /*primary_only=*/true);
          for (const LocalTensor& t : layout->tensors()) {
            if (!t.primary) continue;
            layout->ForEachRun(t, [&](size_t g, size_t, size_t count) {
              for (size_t i = g; i < g + count; ++i) owners[i]++;
            });
          }
        }
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(owners[i], 1) << "pp " << stages << " tp " << tp << " element " << i;
        ASSERT_EQ(rebuilt[i], global[i]) << "pp " << stages << " tp " << tp << " element " << i;
      }
    }
  }
}

TEST(GptLayoutTest, TensorParallelSplitsHeadsOfQKVAndColumnsOfProjections) {
  const GptConfig cfg = Config();                    // C = 16, NH = 4: head size 4
  auto layout = GptLayout::Create(cfg, 0, 1, 1, 2);  // tp rank 1 of 2: heads 2, 3
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->attn_channels(), 8);
  EXPECT_EQ(layout->local_heads(), 2);
  EXPECT_EQ(layout->mlp_channels(), 32);
  std::vector<float> global(GptNumParams(cfg));
  std::iota(global.begin(), global.end(), 0.0f);
  std::vector<float> local(layout->num_params());
  layout->GlobalToLocal(global.data(), local.data());
  const TensorInfo& gq = layout->global_tensors()[2 + 2];  // h.0.qkvw (48, 16)
  ASSERT_EQ(gq.name, "h.0.qkvw");
  const LocalTensor* q = layout->Find("h.0.qkvw");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{24, 16}));
  // Local rows 0..7 are q rows 8..15, rows 8..15 are k rows 24..31, 16..23 v rows 40..47.
  for (int block = 0; block < 3; ++block) {
    for (int r = 0; r < 8; ++r) {
      const size_t global_row = block * 16 + 8 + r;
      EXPECT_EQ(local[q->offset + (block * 8 + r) * 16], global[gq.offset + global_row * 16]);
    }
  }
  const LocalTensor* proj = layout->Find("h.0.attprojw");  // (16, 16) -> columns 8..15
  const TensorInfo& gp = layout->global_tensors()[proj->global];
  EXPECT_EQ(proj->shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(local[proj->offset + 3 * 8 + 5], global[gp.offset + 3 * 16 + 8 + 5]);
  // Replicated tensors count on tp rank 0 only.
  EXPECT_FALSE(layout->Find("h.0.ln1w")->primary);
  EXPECT_TRUE(layout->Find("h.0.fcw")->primary);
}

TEST(GptLayoutTest, TensorParallelSplitsTheVocabularyWhenTpDividesIt) {
  const GptConfig cfg = Config();  // V = 50, Vp = 128, C = 16
  std::vector<float> global(GptNumParams(cfg));
  std::iota(global.begin(), global.end(), 0.0f);
  const int begins[] = {0, 32, 64, 96}, live[] = {32, 18, 0, 0};
  for (int r = 0; r < 4; ++r) {
    auto layout = GptLayout::Create(cfg, 0, 1, r, 4);
    ASSERT_TRUE(layout.ok());
    EXPECT_TRUE(layout->vocab_split());
    EXPECT_EQ(layout->local_vocab(), 32);
    EXPECT_EQ(layout->vocab_begin(), begins[r]);
    EXPECT_EQ(layout->live_vocab(), live[r]);  // ranks 2 and 3 hold padding rows only
    const LocalTensor* wte = layout->Find("wte");
    EXPECT_EQ(wte->shape, (std::vector<int64_t>{32, 16}));
    EXPECT_TRUE(wte->primary);  // each rank's rows are its own
    EXPECT_EQ(layout->wpe_offset(), 32u * 16);
    EXPECT_EQ(layout->Find("wpe")->offset, layout->wpe_offset());
    std::vector<float> local(layout->num_params());
    layout->GlobalToLocal(global.data(), local.data());
    EXPECT_EQ(local[wte->offset + 5 * 16 + 3], global[(begins[r] + 5) * 16 + 3]);
  }
  // tp 3 divides the heads of this config but not Vp = 128: wte stays whole on every rank.
  GptConfig three = cfg;
  three.num_heads = 3;
  three.channels = 12;
  auto replicated = GptLayout::Create(three, 0, 1, 1, 3);
  ASSERT_TRUE(replicated.ok());
  EXPECT_FALSE(replicated->vocab_split());
  EXPECT_EQ(replicated->local_vocab(), 128);
  EXPECT_EQ(replicated->live_vocab(), 50);
  EXPECT_FALSE(replicated->Find("wte")->primary);
}

// GPT-2's padded vocabulary (50304 = 393 units of 128 rows) over tp 5, which does not divide
// it: ranks 0-2 take 79 units, ranks 3-4 take 78, and together they tile wte exactly once.
TEST(GptLayoutTest, AVocabularyTpDoesNotDivideSplitsInUnitsOf128Rows) {
  const GptConfig cfg{16, 50257, 50304, 1, 5, 10};  // maxT V Vp L NH C
  std::vector<float> global(GptNumParams(cfg));
  std::iota(global.begin(), global.end(), 0.0f);
  const int rows[] = {10112, 10112, 10112, 9984, 9984};
  int begin = 0;
  std::vector<int> covered(50304 * 10, 0);
  for (int r = 0; r < 5; ++r) {
    auto layout = GptLayout::Create(cfg, 0, 1, r, 5);
    ASSERT_TRUE(layout.ok()) << layout.status();
    ExpectUnitsTileTheArena(*layout);
    EXPECT_TRUE(layout->vocab_split());
    EXPECT_EQ(layout->local_vocab(), rows[r]) << r;
    EXPECT_EQ(layout->vocab_begin(), begin) << r;
    EXPECT_EQ(layout->live_vocab(), r < 4 ? rows[r] : 50257 - begin);
    const LocalTensor* wte = layout->Find("wte");
    EXPECT_EQ(wte->shape, (std::vector<int64_t>{rows[r], 10}));
    EXPECT_EQ(wte->numel, static_cast<size_t>(rows[r]) * 10);
    EXPECT_EQ(layout->wpe_offset(), wte->numel);
    std::vector<float> local(layout->num_params());
    layout->GlobalToLocal(global.data(), local.data());
    EXPECT_EQ(local[wte->offset + 7 * 10 + 3], global[(begin + 7) * 10 + 3]);
    std::vector<float> back(global.size(), -1.0f);
    layout->LocalToGlobal(local.data(), back.data(), /*primary_only=*/true);
    for (size_t i = 0; i < covered.size(); ++i) {
      if (back[i] >= 0) {
        EXPECT_EQ(back[i], global[i]);
        ++covered[i];
      }
    }
    begin += rows[r];
  }
  EXPECT_EQ(begin, 50304);
  EXPECT_EQ(std::count(covered.begin(), covered.end(), 1), 50304 * 10);
}

// Two stages of two chunks over four layers: virtual stages 0-3 of one layer each, stage 0
// holding layers 0 and 2 (chunks 0 and 1) after the embedding, stage 1 layers 1 and 3
// between the head's copy of wte and the final norm.
TEST(GptLayoutTest, ChunksOfTheInterleavedScheduleHoldEveryPpthLayer) {
  auto first = GptLayout::Create(Config(), 0, 2, 0, 1, {}, 2);
  auto last = GptLayout::Create(Config(), 1, 2, 0, 1, {}, 2);
  ASSERT_TRUE(first.ok() && last.ok());
  EXPECT_EQ(first->chunks(), 2);
  EXPECT_EQ(first->chunk_first_layer(0), 0);
  EXPECT_EQ(first->chunk_first_layer(1), 2);
  EXPECT_EQ(last->chunk_first_layer(0), 1);
  EXPECT_EQ(last->chunk_end_layer(1), 4);
  EXPECT_TRUE(first->embeds(0));
  EXPECT_FALSE(first->embeds(1));
  EXPECT_FALSE(first->heads(1));
  EXPECT_TRUE(last->heads(1));
  EXPECT_FALSE(last->heads(0));
  std::vector<UnitKind> kinds;
  for (const Unit& u : last->units()) kinds.push_back(u.kind);
  EXPECT_EQ(kinds, (std::vector<UnitKind>{UnitKind::kHead, UnitKind::kLayer, UnitKind::kLayer,
                                          UnitKind::kFinalNorm}));
  EXPECT_EQ(last->units()[last->layer_unit(3)].layer, 3);
  EXPECT_EQ(last->layer_unit(3), 2);
  // Per virtual stage as parallel.pp_layers lists them: 2, 1, 2, 1 of six layers.
  GptConfig six = Config();
  six.num_layers = 6;
  auto listed = GptLayout::Create(six, 1, 2, 0, 1, {2, 1, 2, 1}, 2);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->chunk_first_layer(0), 2);
  EXPECT_EQ(listed->chunk_end_layer(0), 3);
  EXPECT_EQ(listed->chunk_first_layer(1), 5);
  EXPECT_EQ(GptLayout::Create(Config(), 0, 2, 0, 1, {}, 4).status().message(),
            "model.n_layer (4) is not divisible by pp (2) x parallel.pp_chunks (4) = 8 virtual "
            "stages; give parallel.pp_layers for an uneven split");
}

TEST(GptLayoutTest, LastOfSeveralStagesHoldsACopyOfTheTiedEmbedding) {
  auto last = GptLayout::Create(Config(), 1, 2, 0, 1);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->chunk_first_layer(0), 2);
  EXPECT_EQ(last->chunk_end_layer(0), 4);
  EXPECT_EQ(last->embedding_unit(), -1);
  ASSERT_GE(last->head_unit(), 0);
  EXPECT_EQ(last->units()[last->head_unit()].kind, UnitKind::kHead);
  const LocalTensor* wte = last->Find("wte");
  ASSERT_NE(wte, nullptr);
  EXPECT_FALSE(wte->primary);  // the first stage's copy is the one that counts
  EXPECT_EQ(last->Find("wpe"), nullptr);
  EXPECT_EQ(last->Find("h.1.qkvw"), nullptr);
  EXPECT_NE(last->Find("lnfw"), nullptr);
}

TEST(GptLayoutTest, StagesTakeTheListedLayerCounts) {
  const GptConfig cfg = Config();  // L = 4
  const int first[] = {0, 3}, end[] = {3, 4};
  for (int stage = 0; stage < 2; ++stage) {
    auto layout = GptLayout::Create(cfg, stage, 2, 0, 1, {3, 1});
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->chunk_first_layer(0), first[stage]);
    EXPECT_EQ(layout->chunk_end_layer(0), end[stage]);
    ExpectUnitsTileTheArena(*layout);
    EXPECT_NE(layout->Find("h." + std::to_string(end[stage] - 1) + ".fcw"), nullptr);
  }
  EXPECT_EQ(GptLayout::Create(cfg, 0, 2, 0, 1, {2, 1}).status().message(),
            "parallel.pp_layers adds up to 3 layers, but model.n_layer is 4");
}

TEST(GptLayoutTest, RejectsSplitsThatDoNotDivide) {
  EXPECT_EQ(
      GptLayout::Create(Config(), 0, 3, 0, 1).status().message(),
      "model.n_layer (4) is not divisible by pp (3); give parallel.pp_layers for an uneven split");
  EXPECT_EQ(GptLayout::Create(Config(), 0, 1, 0, 3).status().message(),
            "model.n_head (4) is not divisible by tp (3)");
  EXPECT_FALSE(GptLayout::Create(Config(), 2, 2, 0, 1).ok());
}

}  // namespace
}  // namespace drover::engine
