#include "tokenizers/byte_bpe.h"

#include <limits>

#include <nlohmann/json.hpp>

#include "tokenizers/unicode.h"

namespace atelier::bpe {

const std::array<std::string, 256>& byte_symbols() {
  static const std::array<std::string, 256> table = [] {
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    std::array<std::string, 256> t;
    int next = 0;
    for (int b = 0; b < 256; ++b) unicode::append_utf8(printable(b) ? char32_t(b) : char32_t(256 + next++), t[size_t(b)]);
    return t;
  }();
  return table;
}

Status MergeTable::build(const std::vector<std::pair<std::string, std::string>>& merges,
                         const std::unordered_map<std::string, int32_t>& vocab, const std::string& where) {
  merges_.clear();
  merges_.reserve(merges.size());
  std::string joined;
  int32_t rank = 0;
  for (const auto& [a, b] : merges) {
    joined.assign(a).append(b);
    auto ia = vocab.find(a), ib = vocab.find(b), im = vocab.find(joined);
    if (ia == vocab.end() || ib == vocab.end() || im == vocab.end())
      return corrupt(where + ": merge '" + a + " " + b + "' uses or makes a token that is not in the vocabulary");
    merges_[key(ia->second, ib->second)] = Merge{rank++, im->second};
  }
  return Status::ok();
}

void MergeTable::merge(std::vector<int32_t>& sym) const {
  std::vector<int32_t> next;
  while (sym.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    uint64_t best_key = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merges_.find(key(sym[i], sym[i + 1]));
      if (it != merges_.end() && it->second.rank < best_rank) best_rank = it->second.rank, best_key = it->first;
    }
    if (best_rank == std::numeric_limits<int32_t>::max()) break;
    const int32_t merged = merges_.at(best_key).id;
    next.clear();
    next.reserve(sym.size());
    for (size_t i = 0; i < sym.size(); ++i) {
      if (i + 1 < sym.size() && key(sym[i], sym[i + 1]) == best_key) {
        next.push_back(merged);
        ++i;
      } else {
        next.push_back(sym[i]);
      }
    }
    sym.swap(next);
  }
}

Status read_model(const nlohmann::json& model, const std::string& label, std::unordered_map<std::string, int32_t>& vocab,
                  std::vector<std::pair<std::string, std::string>>& merges) {
  if (model.value("type", "") != "BPE") return unsupported(label + ": only BPE models are supported");
  const nlohmann::json vocab_json = model.value("vocab", nlohmann::json::object());  // named: items() must not outlive it
  for (const auto& [token, id] : vocab_json.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max())
      return corrupt(label + ": vocabulary id of '" + token + "' is not a non-negative integer");
    vocab[token] = int32_t(id.get<int64_t>());
  }
  for (const nlohmann::json& m : model.value("merges", nlohmann::json::array())) {
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else if (m.is_string()) {  // older files write "left right"
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) return corrupt(label + ": bad merge '" + s + "'");
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      return corrupt(label + ": a merge is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  return Status::ok();
}

}  // namespace atelier::bpe
