// safetensors reader/writer: round trips of every dtype, conversions, the fixture files, validation of each
// malformed-header case, and a deterministic fuzz pass (truncations, byte flips, hand-written headers).
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "test_util.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("atelier_st_" + std::to_string(::getpid()) + "_" + name);
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A file image from a header text and a data section.
std::string make_file(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = char(uint8_t(n >> (8 * i)));
  return out + header + data;
}

// A host tensor of `dtype` whose bytes are exactly `bytes`.
Tensor tensor_from_bytes(const Shape& shape, DType dtype, const std::vector<uint8_t>& bytes) {
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(t.nbytes(), bytes.size());
  if (!bytes.empty()) std::memcpy(t.raw(), bytes.data(), bytes.size());
  return t;
}

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<float> load_f32(const SafeTensorsFile& f, const std::string& name) {
  auto t = f.load(name, DType::F32);
  EXPECT_TRUE(t.has_value()) << t.status().message();
  if (!t) return {};
  const float* p = t->data<float>();
  return std::vector<float>(p, p + t->numel());
}

struct DTypeCase {
  DType dtype;
  std::vector<uint8_t> bytes;     // 4 elements
  std::vector<float> as_f32;      // what load(F32) must give
};

std::vector<DTypeCase> every_dtype_case() {
  return {
      {DType::F32, as_bytes<float>({1.5f, -2.25f, 0.0f, 1e30f}), {1.5f, -2.25f, 0.0f, 1e30f}},
      {DType::F64, as_bytes<double>({1.5, -2.25, 1.0 / 3.0, 1e300}), {1.5f, -2.25f, float(1.0 / 3.0), INFINITY}},
      {DType::F16, as_bytes<uint16_t>({0x3c00, 0xc000, 0x0001, 0x7c00}), {1.0f, -2.0f, 5.9604645e-08f, INFINITY}},
      {DType::BF16, as_bytes<uint16_t>({0x3f80, 0xc040, 0x4049, 0xff80}), {1.0f, -3.0f, 3.140625f, -INFINITY}},
      {DType::I64, as_bytes<int64_t>({1, -2, int64_t(1) << 40, 0}), {1.0f, -2.0f, 1099511627776.0f, 0.0f}},
      {DType::I32, as_bytes<int32_t>({49406, -7, 0, 2147483647}), {49406.0f, -7.0f, 0.0f, 2147483648.0f}},
      {DType::I16, as_bytes<int16_t>({-32768, 5, 0, 32767}), {-32768.0f, 5.0f, 0.0f, 32767.0f}},
      {DType::I8, as_bytes<int8_t>({-128, -1, 0, 127}), {-128.0f, -1.0f, 0.0f, 127.0f}},
      {DType::U8, as_bytes<uint8_t>({0, 1, 128, 255}), {0.0f, 1.0f, 128.0f, 255.0f}},
      {DType::BOOL, as_bytes<uint8_t>({0, 1, 1, 0}), {0.0f, 1.0f, 1.0f, 0.0f}},
      // e4m3fn: 0x38 = 1.0, 0xc4 = -3.0 (exp 8, mant 4 -> 2 * 1.5), 0x01 = 2^-9, 0x7e = 448 (max), 0x7f = NaN.
      {DType::F8E4M3, as_bytes<uint8_t>({0x38, 0xc4, 0x01, 0x7e}), {1.0f, -3.0f, 1.0f / 512.0f, 448.0f}},
  };
}

TEST(SafeTensors, RoundTripEveryDType) {
  const fs::path path = temp_path("every_dtype.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  const auto cases = every_dtype_case();
  for (const auto& c : cases)
    tensors.emplace_back("t." + std::string(dtype_name(c.dtype)), tensor_from_bytes({2, 2}, c.dtype, c.bytes));
  tensors.emplace_back("scalar", tensor_from_bytes({}, DType::F32, as_bytes<float>({7.0f})));
  tensors.emplace_back("empty", tensor_from_bytes({0, 3}, DType::F16, {}));
  ASSERT_TRUE(write_safetensors(path.string(), tensors, {{"format", "pt"}, {"note", "round trip"}}).is_ok());

  // The data section must start 8-byte aligned.
  const std::string bytes = read_bytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);

  auto f = SafeTensorsFile::open(path.string());
  ASSERT_TRUE(f.has_value()) << f.status().message();
  EXPECT_EQ((*f)->tensors().size(), tensors.size());
  EXPECT_EQ((*f)->metadata().value("format", ""), "pt");
  EXPECT_EQ((*f)->metadata().value("note", ""), "round trip");
  for (const auto& c : cases) {
    const std::string name = "t." + std::string(dtype_name(c.dtype));
    const TensorInfo* info = (*f)->find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->dtype, c.dtype);
    EXPECT_EQ(info->shape, (Shape{2, 2}));
    auto same = (*f)->load(name, c.dtype);
    ASSERT_TRUE(same.has_value()) << same.status().message();
    EXPECT_EQ(std::memcmp(same->raw(), c.bytes.data(), c.bytes.size()), 0) << name;
    EXPECT_EQ(std::memcmp((*f)->raw(*info), c.bytes.data(), c.bytes.size()), 0) << name;
    const std::vector<float> got = load_f32(**f, name);
    ASSERT_EQ(got.size(), 4u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], c.as_f32[i]) << name << "[" << i << "]";
  }
  auto scalar = (*f)->load("scalar");
  ASSERT_TRUE(scalar.has_value());
  EXPECT_EQ(scalar->dim(), 0);
  EXPECT_EQ(scalar->data<float>()[0], 7.0f);
  auto empty = (*f)->load("empty");
  ASSERT_TRUE(empty.has_value());
  EXPECT_EQ(empty->shape(), (Shape{0, 3}));
  fs::remove(path);
}

// read_range gives a tensor in pieces, as a GPU's staging buffers ask for it: whatever the cut, the pieces put
// together are load()'s bytes, for the vector conversions (on every core, with tails), the generic one and a plain
// copy. Pieces off element boundaries or past the end are errors, and a forged TensorInfo is refused.
TEST(SafeTensors, RangesReadInPiecesEqualTheWholeLoad) {
  const fs::path path = temp_path("ranges.safetensors");
  constexpr int64_t kElements = 300007;  // past the conversions' and the copy's thresholds for threads; odd: tails
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<uint16_t> f16(kElements), bf16(kElements);
  std::vector<float> f32(kElements);
  std::vector<double> f64(kElements);
  for (int64_t i = 0; i < kElements; ++i) {
    f32[size_t(i)] = normal(rng);
    f16[size_t(i)] = float_to_f16(f32[size_t(i)]);
    bf16[size_t(i)] = float_to_bf16(f32[size_t(i)]);
    f64[size_t(i)] = double(f32[size_t(i)]) * 1.000001;
  }
  const Shape shape = {kElements};
  ASSERT_TRUE(write_safetensors(path.string(), {{"f16", tensor_from_bytes(shape, DType::F16, as_bytes(f16))},
                                                {"bf16", tensor_from_bytes(shape, DType::BF16, as_bytes(bf16))},
                                                {"f32", tensor_from_bytes(shape, DType::F32, as_bytes(f32))},
                                                {"f64", tensor_from_bytes(shape, DType::F64, as_bytes(f64))}})
                  .is_ok());
  auto f = SafeTensorsFile::open(path.string());
  ASSERT_TRUE(f.has_value()) << f.status().message();
  const std::vector<std::pair<std::string, DType>> cases = {
      {"f16", DType::BF16}, {"f16", DType::F32}, {"f32", DType::BF16}, {"bf16", DType::F32},
      {"f64", DType::F16},  {"bf16", DType::BF16}, {"f32", DType::F32}};
  for (const auto& [name, dtype] : cases) {
    SCOPED_TRACE(name + " -> " + std::string(dtype_name(dtype)));
    const TensorInfo* info = (*f)->find(name);
    ASSERT_NE(info, nullptr);
    auto whole = (*f)->load(*info, dtype);
    ASSERT_TRUE(whole.has_value()) << whole.status().message();
    const size_t es = dtype_size(dtype), total = whole->nbytes();
    if (info->dtype == dtype) EXPECT_EQ(std::memcmp(whole->raw(), (*f)->raw(*info), total), 0) << "a plain copy";
    std::vector<char> pieces(total, 0);
    size_t offset = 0;
    for (size_t len : {size_t(1), size_t(7), size_t(4099), size_t(131072), size_t(100)}) {
      ASSERT_TRUE((*f)->read_range(*info, dtype, offset, len * es, pieces.data() + offset).is_ok());
      offset += len * es;
    }
    ASSERT_TRUE((*f)->read_range(*info, dtype, offset, total - offset, pieces.data() + offset).is_ok());
    EXPECT_EQ(std::memcmp(pieces.data(), whole->raw(), total), 0);
    EXPECT_FALSE((*f)->read_range(*info, dtype, es + 1, es, pieces.data()).is_ok()) << "off an element boundary";
    EXPECT_FALSE((*f)->read_range(*info, dtype, total - es, 2 * es, pieces.data()).is_ok()) << "past the end";
    EXPECT_TRUE((*f)->read_range(*info, dtype, total, 0, pieces.data()).is_ok()) << "an empty piece at the end";
  }
  TensorInfo forged = *(*f)->find("f32");
  forged.shape = {kElements * 2};  // the same bytes claiming more elements: would read past them
  EXPECT_FALSE((*f)->load(forged, DType::F32).has_value());
  float sink = 0.0f;
  EXPECT_FALSE((*f)->read_range(forged, DType::F32, 0, sizeof sink, &sink).is_ok());
  fs::remove(path);
}

TEST(SafeTensors, F8NaNAndSubnormals) {
  auto f = SafeTensorsFile::from_bytes(
      make_file(R"({"x":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", std::string("\x7f\xff\x07\x08", 4)));
  ASSERT_TRUE(f.has_value()) << f.status().message();
  const auto v = load_f32(**f, "x");
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_TRUE(std::isnan(v[1]));
  EXPECT_EQ(v[2], 7.0f / 512.0f);    // largest subnormal
  EXPECT_EQ(v[3], 1.0f / 64.0f);     // smallest normal 2^-6
}

TEST(SafeTensors, ConvertsToHalfTypesWithRoundToNearestEven) {
  const fs::path path = temp_path("convert.safetensors");
  // 1 + 2^-11 is halfway between two f16 values: ties to even (1.0); 1 + 2^-8 is a bf16 tie -> 1.0.
  const std::vector<float> v = {1.0f + 1.0f / 2048.0f, 1.0f + 3.0f / 2048.0f, 1.0f + 1.0f / 256.0f, 65520.0f};
  ASSERT_TRUE(write_safetensors(path.string(), {{"v", Tensor::from_vector(v, {4})}}).is_ok());
  auto f = SafeTensorsFile::open(path.string());
  ASSERT_TRUE(f.has_value());
  auto h = (*f)->load("v", DType::F16);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->data<uint16_t>()[0], 0x3c00);
  EXPECT_EQ(h->data<uint16_t>()[1], 0x3c02);
  EXPECT_EQ(h->data<uint16_t>()[3], 0x7c00);
  auto b = (*f)->load("v", DType::BF16);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->data<uint16_t>()[2], 0x3f80);
  auto d = (*f)->load("v", DType::F64);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->data<double>()[0], double(v[0]));
  // Integer targets need the same dtype.
  auto i = (*f)->load("v", DType::I32);
  ASSERT_FALSE(i.has_value());
  EXPECT_NE(i.status().message().find("'v'"), std::string::npos) << i.status().message();
  EXPECT_EQ((*f)->load("missing").status().code(), ErrorCode::kNotFound);
  fs::remove(path);
}

TEST(SafeTensors, WritesNonContiguousTensorsInLogicalOrder) {
  const fs::path path = temp_path("transposed.safetensors");
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3}).transpose(0, 1);  // [3, 2]: 0 3 1 4 2 5
  ASSERT_FALSE(t.is_contiguous());
  ASSERT_TRUE(write_safetensors(path.string(), {{"t", t}}).is_ok());
  auto f = SafeTensorsFile::open(path.string());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ((*f)->find("t")->shape, (Shape{3, 2}));
  EXPECT_EQ(load_f32(**f, "t"), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  fs::remove(path);
}

TEST(SafeTensors, WriterRejectsBadInput) {
  const fs::path path = temp_path("bad_write.safetensors");
  Tensor t = Tensor::from_vector({1}, {1});
  EXPECT_FALSE(write_safetensors(path.string(), {{"a", t}, {"a", t}}).is_ok());
  EXPECT_FALSE(write_safetensors(path.string(), {{"__metadata__", t}}).is_ok());
  EXPECT_FALSE(write_safetensors(path.string(), {{"a", t}}, {{"n", 3}}).is_ok());
  EXPECT_FALSE(write_safetensors("/nonexistent-dir/x.safetensors", {{"a", t}}).is_ok());
  EXPECT_FALSE(fs::exists(path));
}

TEST(SafeTensors, OpenReportsMissingFile) {
  auto f = SafeTensorsFile::open("/nonexistent/file.safetensors");
  ASSERT_FALSE(f.has_value());
  EXPECT_EQ(f.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(f.status().message().find("/nonexistent/file.safetensors"), std::string::npos);
}

TEST(SafeTensors, ReadsFixtureUNetF16) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const std::string path = (dir / "model/unet/diffusion_pytorch_model.safetensors").string();
  auto f = SafeTensorsFile::open(path);
  ASSERT_TRUE(f.has_value()) << f.status().message();
  EXPECT_EQ((*f)->tensors().size(), 684u);
  EXPECT_EQ((*f)->metadata().value("format", ""), "pt");
  const TensorInfo* info = (*f)->find("conv_in.weight");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->dtype, DType::F16);
  EXPECT_EQ(info->shape, (Shape{32, 4, 3, 3}));
  EXPECT_EQ(info->begin, 64u);
  EXPECT_EQ(info->end, 2368u);
  // Values read independently with numpy from the same file (exact, as hex floats).
  const auto v = load_f32(**f, "conv_in.weight");
  ASSERT_EQ(v.size(), 32u * 4 * 9);
  EXPECT_EQ(v[0], -0x1.224p-10f);
  EXPECT_EQ(v[1], 0x1.44p-4f);
  EXPECT_EQ(v[2], -0x1.12p-3f);
  EXPECT_EQ(v[3], -0x1.e08p-4f);
  double sum = 0;
  for (float x : v) sum += x;
  EXPECT_NEAR(sum, -5.985268771648407, 1e-9);
  // Every tensor loads; offsets are in file order and the f16 -> f32 conversion is exact.
  size_t prev_end = 0;
  for (const TensorInfo& t : (*f)->tensors()) {
    EXPECT_GE(t.begin, prev_end) << t.name;
    prev_end = t.end;
    auto x = (*f)->load(t, DType::F32);
    ASSERT_TRUE(x.has_value()) << x.status().message();
    auto h = (*f)->load(t, DType::F16);
    ASSERT_TRUE(h.has_value());
    for (int64_t i = 0; i < x->numel(); ++i)
      ASSERT_EQ(x->data<float>()[i], f16_to_float(h->data<uint16_t>()[i])) << t.name << "[" << i << "]";
  }
}

TEST(SafeTensors, ReadsFixtureGolden) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto f = SafeTensorsFile::open((dir / "golden.safetensors").string());
  ASSERT_TRUE(f.has_value()) << f.status().message();
  EXPECT_EQ((*f)->tensors().size(), 49u);
  const TensorInfo* tok = (*f)->find("tokens.0");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->dtype, DType::I32);
  auto ids = (*f)->load("tokens.0", DType::I32);
  ASSERT_TRUE(ids.has_value());
  EXPECT_EQ(ids->shape(), (Shape{1, 77}));
  const int32_t expect_ids[] = {49406, 320, 1125, 539, 550, 18376, 6765, 320, 4558, 525};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(ids->data<int32_t>()[i], expect_ids[i]);
  EXPECT_EQ(load_f32(**f, "tokens.0")[0], 49406.0f);
  const auto out = load_f32(**f, "unet.out.t999");
  ASSERT_EQ(out.size(), 2u * 4 * 16 * 16);
  EXPECT_EQ(out[0], -0x1.d9e48cp-7f);
  EXPECT_EQ(out[1], 0x1.c84a44p-2f);
  double sum = 0;
  for (float x : out) sum += x;
  EXPECT_NEAR(sum, -140.14619102422148, 1e-9);
  // test_util's golden() goes through this reader.
  EXPECT_EQ(test::golden("sd15-tiny", "unet.out.t999").shape(), (Shape{2, 4, 16, 16}));
}

// ---- validation ---------------------------------------------------------------------------------------

struct BadCase {
  const char* what;
  std::string file;
  const char* expect;  // substring of the error message
};

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, const std::string& off) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + off + "}";
}

std::vector<BadCase> bad_cases() {
  const std::string d8(8, '\0');
  auto one = [&](const std::string& body, const std::string& data = std::string(8, '\0')) {
    return make_file("{" + body + "}", data);
  };
  std::string huge_len(8, '\0');
  huge_len[7] = char(0x80);  // 2^63
  std::string over_cap = make_file("{}");
  const uint64_t cap_plus = (uint64_t(100) << 20) + 1;
  for (int i = 0; i < 8; ++i) over_cap[i] = char(uint8_t(cap_plus >> (8 * i)));
  std::string past_end = make_file("{}");
  past_end[0] = 3;
  return {
      {"empty file", "", "too short"},
      {"7 bytes", std::string(7, '\0'), "too short"},
      {"length 2^63", huge_len + "{}", "exceeds"},
      {"length over cap", over_cap, "exceeds"},
      {"length past end", past_end, "past the end"},
      {"header array", make_file("[]"), "must be a JSON object"},
      {"header null", make_file("null"), "must be a JSON object"},
      {"header truncated", make_file("{\"a\":"), "not valid JSON"},
      {"header garbage", make_file("\xff\xfe"), "not valid JSON"},
      {"header empty", make_file(""), "not valid JSON"},
      {"bad utf8 key", make_file("{\"\xc3\x28\":1}"), "not valid JSON"},
      {"non-object entry", one("\"a\":5"), "'a': entry must be an object"},
      {"entry array", one("\"a\":[1]"), "entry must be an object"},
      {"missing dtype", one("\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}"), "missing field 'dtype'"},
      {"missing shape", one("\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}"), "missing field 'shape'"},
      {"missing offsets", one("\"a\":{\"dtype\":\"F32\",\"shape\":[1]}"), "missing field 'data_offsets'"},
      {"unknown dtype", one(entry("a", "F99", "[1]", "[0,4]")), "unknown dtype 'F99'"},
      {"f8 e5m2 unsupported", one(entry("a", "F8_E5M2", "[1]", "[0,1]")), "unknown dtype 'F8_E5M2'"},
      {"dtype number", one("\"a\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}"), "dtype must be a string"},
      {"shape not array", one(entry("a", "F32", "4", "[0,4]")), "shape must be an array"},
      {"shape negative", one(entry("a", "F32", "[-1]", "[0,4]")), "shape entry 0 (-1)"},
      {"shape float", one(entry("a", "F32", "[1.5]", "[0,4]")), "shape entry 0"},
      {"shape float integral", one(entry("a", "F32", "[1.0]", "[0,4]")), "not a non-negative integer"},
      {"shape string", one(entry("a", "F32", "[\"1\"]", "[0,4]")), "not a non-negative integer"},
      {"shape null", one(entry("a", "F32", "[1,null]", "[0,4]")), "shape entry 1"},
      {"shape > int64", one(entry("a", "F32", "[18446744073709551615]", "[0,4]")), "too large"},
      {"shape numel overflow", one(entry("a", "F32", "[4294967296,4294967296,4294967296]", "[0,4]")), "overflows"},
      {"shape bytes overflow", one(entry("a", "F64", "[4611686018427387904]", "[0,8]")), "overflows"},
      {"empty but huge dims", one(entry("a", "F32", "[0,9223372036854775807,9223372036854775807]", "[0,0]")),
       "overflows"},
      {"shape huge number", one(entry("a", "F32", "[1e400]", "[0,4]")), "not valid JSON"},
      {"offsets one", one(entry("a", "F32", "[1]", "[0]")), "data_offsets must be [begin, end]"},
      {"offsets three", one(entry("a", "F32", "[1]", "[0,4,8]")), "data_offsets must be"},
      {"offsets strings", one(entry("a", "F32", "[1]", "[\"0\",\"4\"]")), "data_offsets must be"},
      {"offsets negative", one(entry("a", "F32", "[1]", "[-4,0]")), "data_offsets must be"},
      {"offsets float", one(entry("a", "F32", "[1]", "[0,4.0]")), "data_offsets must be"},
      {"offsets object", one(entry("a", "F32", "[1]", "{\"b\":0}")), "data_offsets must be"},
      {"end before begin", one(entry("a", "F32", "[1]", "[4,0]")), "before begin"},
      {"end past data", one(entry("a", "F32", "[3]", "[0,12]")), "past the data section"},
      {"end far past data", one(entry("a", "F32", "[1]", "[18446744073709551611,18446744073709551615]")), "past the data section"},
      {"size mismatch", one(entry("a", "F32", "[1]", "[0,3]")), "needs 4"},
      {"size mismatch f16", one(entry("a", "F16", "[2,2]", "[0,4]")), "needs 8"},
      {"duplicate tensor", one(entry("a", "F32", "[1]", "[0,4]") + "," + entry("a", "F32", "[1]", "[4,8]")),
       "'a' more than once"},
      {"duplicate field", one("\"a\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,4]}"),
       "'dtype' more than once"},
      {"overlap", one(entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[2,6]")), "overlap"},
      {"metadata array", one("\"__metadata__\":[1]"), "__metadata__ must be an object"},
  };
}

TEST(SafeTensors, RejectsEachMalformedHeaderWithAClearMessage) {
  for (const BadCase& c : bad_cases()) {
    auto f = SafeTensorsFile::from_bytes(c.file, "bad.safetensors");
    ASSERT_FALSE(f.has_value()) << c.what;
    const std::string& m = f.status().message();
    EXPECT_NE(m.find("bad.safetensors"), std::string::npos) << c.what << ": " << m;
    EXPECT_NE(m.find(c.expect), std::string::npos) << c.what << ": " << m;
  }
}

TEST(SafeTensors, AcceptsEdgeCasesThatAreValid) {
  // Zero-size tensor, holes between tensors, trailing bytes, padded header.
  const std::string header = "{" + entry("z", "F32", "[0,5,7]", "[0,0]") + "," +
                             entry("a", "U8", "[2]", "[4,6]") + ",\"__metadata__\":{\"k\":\"v\"}}   ";
  auto f = SafeTensorsFile::from_bytes(make_file(header, std::string("\0\0\0\0\x05\x07\0", 7)), "edge");
  ASSERT_TRUE(f.has_value()) << f.status().message();
  EXPECT_EQ(load_f32(**f, "a"), (std::vector<float>{5, 7}));
  auto z = (*f)->load("z");
  ASSERT_TRUE(z.has_value());
  EXPECT_EQ(z->numel(), 0);
  EXPECT_EQ(z->shape(), (Shape{0, 5, 7}));
  EXPECT_EQ((*f)->metadata().value("k", ""), "v");
}

TEST(SafeTensors, DeeplyNestedHeaderDoesNotCrash) {
  const int depth = 100000;
  auto f = SafeTensorsFile::from_bytes(make_file(std::string(depth, '[') + std::string(depth, ']')), "deep");
  EXPECT_FALSE(f.has_value());
  auto g = SafeTensorsFile::from_bytes(make_file("{\"a\":" + std::string(depth, '[') + std::string(depth, ']') + "}"), "deep");
  EXPECT_FALSE(g.has_value());
}

// ---- fuzz ---------------------------------------------------------------------------------------------

// A small valid file: three tensors of different dtypes and metadata.
std::string small_valid_file() {
  const fs::path path = temp_path("fuzz_seed.safetensors");
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"w", Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3})},
      {"h", tensor_from_bytes({3}, DType::F16, as_bytes<uint16_t>({0x3c00, 0x4000, 0x4200}))},
      {"i", tensor_from_bytes({2}, DType::I64, as_bytes<int64_t>({7, -7}))},
  };
  EXPECT_TRUE(write_safetensors(path.string(), tensors, {{"format", "pt"}}).is_ok());
  std::string bytes = read_bytes(path);
  fs::remove(path);
  return bytes;
}

// Opens `bytes`; when accepted, every tensor must lie inside the data section and load in every dtype.
// Returns true when the input was accepted.
bool check_input(const std::string& bytes, const std::string& what) {
  auto f = SafeTensorsFile::from_bytes(bytes, "fuzz");
  if (!f.has_value()) {
    EXPECT_FALSE(f.status().message().empty()) << what;
    return false;
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const uint64_t data_bytes = bytes.size() - 8 - header_len;
  for (const TensorInfo& t : (*f)->tensors()) {
    EXPECT_LE(t.begin, t.end) << what;
    EXPECT_LE(t.end, data_bytes) << what;
    EXPECT_EQ(t.end - t.begin, size_t(numel_of(t.shape)) * dtype_size(t.dtype)) << what;
    for (DType d : {DType::F32, DType::F16, DType::BF16, t.dtype}) {
      auto x = (*f)->load(t, d);
      EXPECT_TRUE(x.has_value()) << what << ": " << x.status().message();
    }
  }
  return true;
}

TEST(SafeTensors, FuzzTruncationsAndByteFlips) {
  const std::string seed = small_valid_file();
  ASSERT_TRUE(check_input(seed, "seed"));
  int inputs = 0, accepted = 0;
  // Every truncation: all must fail (the seed has no trailing slack).
  for (size_t n = 0; n < seed.size(); ++n) {
    EXPECT_FALSE(check_input(seed.substr(0, n), "truncated to " + std::to_string(n))) << n;
    ++inputs;
  }
  // Random flips of 1..4 bytes anywhere (mostly in the header, where the parser is), fixed seed.
  std::mt19937 rng(20240611);
  uint64_t header_len = 0;
  std::memcpy(&header_len, seed.data(), 8);
  for (int k = 0; k < 600; ++k) {
    std::string s = seed;
    const int flips = 1 + int(rng() % 4);
    for (int j = 0; j < flips; ++j) {
      const size_t limit = (k % 4 == 0) ? s.size() : size_t(8 + header_len);
      const size_t pos = rng() % limit;
      s[pos] = char(rng() % 256);
    }
    accepted += check_input(s, "flip #" + std::to_string(k)) ? 1 : 0;
    ++inputs;
  }
  // Flips that replace one header digit or character by a structural one, at every header position.
  for (size_t pos = 8; pos < 8 + header_len; ++pos) {
    for (char c : {'"', '-', '9', '}'}) {
      std::string s = seed;
      s[pos] = c;
      accepted += check_input(s, "set " + std::to_string(pos)) ? 1 : 0;
      ++inputs;
    }
  }
  for (const BadCase& c : bad_cases()) {
    EXPECT_FALSE(check_input(c.file, c.what));
    ++inputs;
  }
  EXPECT_GT(inputs, 1000);
  EXPECT_GT(accepted, 0);  // some flips land in data or whitespace and stay valid
  std::printf("[fuzz] %d inputs, %d accepted as valid\n", inputs, accepted);
}

}  // namespace
}  // namespace atelier
