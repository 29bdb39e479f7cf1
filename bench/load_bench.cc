// Weight loading throughput: how long a full-size checkpoint takes from its file to a device, the part of a CLI
// `generate` (and of a server's model load) before any planning or denoising. Writes SD 1.5's UNet (860 M parameters,
// diffusers' key names) as one safetensors file of deterministic values into DIR (once; kept for later runs), then
// times UNet::load from it onto the device in that device's default dtype, the way `generate` loads a diffusers
// folder. The file is read from the page cache after the first run (the write leaves it there too): the figure is
// the loader's own rate, not the disk's.
//   ./build/bench/load_bench [--device cpu|cuda[:N]] [--dir DIR] [--file-dtype f16|bf16|f32] [--dtype f16|bf16|f32]
//                            [--runs N] [--host-side]
// Prints one line per run: seconds, GB/s of file bytes, parameters per second.
// --host-side times, instead, the host's part of a GPU load on any machine: every tensor of the file in --dtype,
// written a staging slot (8 MB, reused) at a time as CudaBackend::upload has it converted into its pinned buffers,
// against the way before session 67 (the whole tensor converted into a new host tensor, then copied into the slots).
// The copy engine's part is left out: on a GPU it overlaps the next slot's fill.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/ops.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "models/common/weights.h"
#include "models/sd/unet.h"
#include "pipeline/builtin_models.h"
#include "pipeline/sd_model.h"

namespace atelier {
namespace {

struct Options {
  std::string device = "cpu", dir = "/tmp/atelier-load-bench", file_dtype = "f16";
  std::string dtype;  // the loaded weights' dtype; "" = the device's default (f32 on the CPU, bf16 on CUDA)
  int runs = 3;
  bool host_side = false;
};

Expected<Options> parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--host-side") {
      o.host_side = true;
      continue;
    }
    if (i + 1 >= argc) return invalid_argument("load_bench: " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--device") o.device = v;
    else if (a == "--dir") o.dir = v;
    else if (a == "--file-dtype") o.file_dtype = v;
    else if (a == "--dtype") o.dtype = v;
    else if (a == "--runs") o.runs = std::max(1, std::atoi(v.c_str()));
    else return invalid_argument("load_bench: unknown flag " + a + " (--device, --dir, --file-dtype, --dtype, --runs, --host-side)");
  }
  for (const std::string* d : {&o.file_dtype, &o.dtype})
    if (!d->empty() && *d != "f16" && *d != "bf16" && *d != "f32")
      return invalid_argument("load_bench: --file-dtype and --dtype take f16, bf16 or f32");
  return o;
}

DType dtype_of(const std::string& name) { return name == "f32" ? DType::F32 : name == "bf16" ? DType::BF16 : DType::F16; }

// Small deterministic values (|v| < 1/16, as trained weights mostly are), written as f32 then cast to the file dtype.
Tensor parameter(const Shape& shape, uint64_t seed, DType dtype) {
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = t.data<float>();
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    p[i] = float(int64_t(s >> 40) - (int64_t(1) << 23)) / float(int64_t(1) << 27);
  }
  return dtype == DType::F32 ? t : ops::cast(t, dtype);
}

// The UNet's file in `dir` (written when missing); its size in bytes.
Expected<std::pair<std::string, size_t>> ensure_checkpoint(const UNetConfig& config, const Options& o) {
  const std::string path = o.dir + "/sd15-unet-" + o.file_dtype + ".safetensors";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    std::filesystem::create_directories(o.dir, ec);
    ATELIER_ASSIGN_OR_RETURN(auto shapes, UNet::parameter_shapes(config));
    const DType dtype = dtype_of(o.file_dtype);
    std::vector<std::pair<std::string, Tensor>> tensors;
    uint64_t seed = 0;
    for (const auto& [key, shape] : shapes) tensors.emplace_back(key, parameter(shape, ++seed, dtype));
    std::fprintf(stderr, "load_bench: writing %zu tensors to %s\n", tensors.size(), path.c_str());
    ATELIER_RETURN_IF_ERROR(write_safetensors(path, tensors));
  }
  return std::make_pair(path, size_t(std::filesystem::file_size(path)));
}

// The loader's device copies of a few tensors (the first ones and the largest) against the file read on the host: a
// load that is fast but wrong fails here.
Status check_loaded_values(const WeightStore& store, const UNetConfig& config, Device device, DType dtype) {
  ATELIER_ASSIGN_OR_RETURN(auto shapes, UNet::parameter_shapes(config));
  constexpr size_t kFirst = 8;
  std::vector<std::pair<std::string, Shape>> picked(shapes.begin(), shapes.begin() + std::min(kFirst, shapes.size()));
  picked.push_back(*std::max_element(shapes.begin(), shapes.end(),
                                     [](const auto& a, const auto& b) { return numel_of(a.second) < numel_of(b.second); }));
  WeightLoader loader(store, device, dtype);
  std::vector<Tensor> loaded(picked.size());
  for (size_t i = 0; i < picked.size(); ++i) loader.tensor(loaded[i], picked[i].first, picked[i].second);
  ATELIER_RETURN_IF_ERROR(loader.finish());
  for (size_t i = 0; i < picked.size(); ++i) {
    ATELIER_ASSIGN_OR_RETURN(Tensor want, store.read(picked[i].first, dtype));
    const Tensor got = loaded[i].to(Device::cpu());
    if (got.nbytes() != want.nbytes() || std::memcmp(got.raw(), want.raw(), want.nbytes()) != 0)
      return internal_error("load_bench: " + picked[i].first + " on " + device.str() + " differs from the file");
  }
  std::printf("checked: %zu tensors on %s equal the file's values\n", picked.size(), device.str().c_str());
  return Status::ok();
}

// Seconds to put every tensor of `file` in `dtype` through one reused slot of a staging ring's size, either converted
// straight into it (`pieces`) or through a whole host tensor first.
Expected<double> time_host_side(const SafeTensorsFile& file, DType dtype, bool pieces) {
  constexpr size_t kSlotBytes = size_t(8) << 20;  // cuda::PinnedStaging::kSlotBytes
  std::vector<char> slot(kSlotBytes);
  const auto start = std::chrono::steady_clock::now();
  for (const TensorInfo& info : file.tensors()) {
    const size_t bytes = size_t(numel_of(info.shape)) * dtype_size(dtype);
    Tensor whole;
    if (!pieces) {
      ATELIER_ASSIGN_OR_RETURN(whole, file.load(info, dtype));
    }
    for (size_t off = 0; off < bytes; off += kSlotBytes) {
      const size_t len = std::min(kSlotBytes, bytes - off);
      if (pieces) ATELIER_RETURN_IF_ERROR(file.read_range(info, dtype, off, len, slot.data()));
      else std::memcpy(slot.data(), static_cast<const char*>(whole.raw()) + off, len);
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Status run_host_side(const Options& o, const std::pair<std::string, size_t>& file, DType dtype) {
  std::printf("load_bench: host side of a GPU load, %s file of %.3f GB into %s slots\n", o.file_dtype.c_str(),
              file.second / 1e9, std::string(dtype_name(dtype)).c_str());
  for (int r = 0; r < o.runs; ++r) {
    for (const bool pieces : {false, true}) {
      // Opened again for each: a load maps the file afresh, and the first touch of each page costs a fault.
      ATELIER_ASSIGN_OR_RETURN(auto st, SafeTensorsFile::open(file.first));
      ATELIER_ASSIGN_OR_RETURN(double s, time_host_side(*st, dtype, pieces));
      std::printf("run %d, %s: %.3f s, %.2f GB/s of file\n", r + 1,
                  pieces ? "converted into the slots" : "host tensor, then copied", s, file.second / 1e9 / s);
    }
  }
  return Status::ok();
}

Status run(const Options& o) {
  ATELIER_ASSIGN_OR_RETURN(Device device, Device::parse(o.device));
  ATELIER_ASSIGN_OR_RETURN(BuiltinSdConfig config, builtin_sd_config("sd15"));
  ATELIER_ASSIGN_OR_RETURN(auto file, ensure_checkpoint(config.unet, o));
  const DType dtype = o.dtype.empty() ? default_model_dtype(device) : dtype_of(o.dtype);
  if (o.host_side) return run_host_side(o, file, dtype);
  std::printf("load_bench: SD 1.5 UNet, %s file of %.3f GB -> %s in %s\n", o.file_dtype.c_str(), file.second / 1e9,
              o.device.c_str(), std::string(dtype_name(dtype)).c_str());
  for (int r = 0; r < o.runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    ATELIER_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open({file.first}));
    ATELIER_ASSIGN_OR_RETURN(UNet unet, UNet::load(store, UNetLayout::kDiffusers, config.unet, device, dtype));
    backend_for(device).synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("run %d: %.3f s, %.2f GB/s of file, %.0f M parameters/s\n", r + 1, s, file.second / 1e9 / s,
                store.count_params() / 1e6 / s);
  }
  ATELIER_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open({file.first}));
  return check_loaded_values(store, config.unet, device, dtype);
}

}  // namespace
}  // namespace atelier

int main(int argc, char** argv) {
  atelier::Expected<atelier::Options> o = atelier::parse(argc, argv);
  const atelier::Status st = o ? atelier::run(*o) : o.status();
  if (!st.is_ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  return 0;
}
