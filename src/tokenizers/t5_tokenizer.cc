#include "tokenizers/t5_tokenizer.h"

#include <cctype>
#include <filesystem>

#include <sentencepiece_processor.h>

namespace atelier {

namespace {
constexpr const char* kModelFile = "spiece.model";
constexpr const char* kExtraIdPrefix = "<extra_id_";
}  // namespace

T5Tokenizer::T5Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
T5Tokenizer::T5Tokenizer(T5Tokenizer&&) noexcept = default;
T5Tokenizer& T5Tokenizer::operator=(T5Tokenizer&&) noexcept = default;
T5Tokenizer::~T5Tokenizer() = default;

Expected<T5Tokenizer> T5Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::string file = path;
  if (fs::is_directory(path)) file = (fs::path(path) / kModelFile).string();
  if (!fs::exists(file)) {
    return not_found("T5 tokenizer: " + file + " not found (a folder with spiece.model, or the .model file, is needed)");
  }
  T5Tokenizer t;
  const auto st = t.sp_->Load(file);
  if (!st.ok()) return corrupt("T5 tokenizer: cannot load " + file + ": " + st.ToString());
  t.piece_count_ = t.sp_->GetPieceSize();
  // T5's model defines pad 0, eos 1, unk 2; a model without a pad id falls back to the "<pad>" piece.
  t.eos_ = t.sp_->eos_id();
  t.pad_ = t.sp_->pad_id() >= 0 ? t.sp_->pad_id() : t.sp_->PieceToId("<pad>");
  t.unk_ = t.sp_->unk_id();
  if (t.eos_ < 0 || t.pad_ < 0) return unsupported("T5 tokenizer: " + file + " defines no </s> or <pad> piece");
  return t;
}

size_t T5Tokenizer::match_special(const std::string& text, size_t pos, int32_t& id) const {
  if (text[pos] != '<') return 0;
  for (int32_t special : {pad_, eos_, unk_}) {
    const std::string& piece = sp_->IdToPiece(special);
    if (text.compare(pos, piece.size(), piece) == 0) {
      id = special;
      return piece.size();
    }
  }
  const std::string prefix = kExtraIdPrefix;
  if (text.compare(pos, prefix.size(), prefix) != 0) return 0;
  size_t end = pos + prefix.size();
  int n = 0, digits = 0;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end])) && digits < 3) {
    n = n * 10 + (text[end++] - '0');
    ++digits;
  }
  if (digits == 0 || end >= text.size() || text[end] != '>' || n >= kExtraIds) return 0;
  id = piece_count_ + kExtraIds - 1 - n;
  return end + 1 - pos;
}

void T5Tokenizer::encode_span(const std::string& span, std::vector<int32_t>& ids) const {
  if (span.empty()) return;
  std::vector<int> out;
  const auto st = sp_->Encode(span, &out);
  ATELIER_CHECK(st.ok(), "sentencepiece encode failed: " + st.ToString());
  ids.insert(ids.end(), out.begin(), out.end());
}

std::vector<int32_t> T5Tokenizer::encode_unpadded(const std::string& text) const {
  std::vector<int32_t> ids;
  size_t start = 0;
  for (size_t pos = 0; pos < text.size();) {
    int32_t id = 0;
    const size_t len = match_special(text, pos, id);
    if (len == 0) {
      ++pos;
      continue;
    }
    encode_span(text.substr(start, pos - start), ids);
    ids.push_back(id);
    pos += len;
    start = pos;
  }
  encode_span(text.substr(start), ids);
  return ids;
}

std::vector<int32_t> T5Tokenizer::encode(const std::string& text, int max_length) const {
  ATELIER_CHECK(max_length >= 1, "T5 tokenizer: max_length must be at least 1");
  std::vector<int32_t> ids = encode_unpadded(text);
  if (int(ids.size()) > max_length - 1) ids.resize(size_t(max_length - 1));
  ids.push_back(eos_);
  ids.resize(size_t(max_length), pad_);
  return ids;
}

}  // namespace atelier
