// `atelier generate`: one request from flags, images written as PNG (with A1111 infotext) + JSON sidecars.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "io/image.h"
#include "pipeline/demo_model.h"
#include "pipeline/model_family.h"
#include "pipeline/sd_pipeline.h"

namespace atelier::cli {
namespace fs = std::filesystem;

void add_generate_command(CLI::App& app, GenerateOptions& o) {
  CLI::App* c = app.add_subcommand("generate", "Generate images from a prompt (txt2img) or an init image (img2img)");
  GenerateRequest& r = o.request;
  c->add_option("--model", o.model,
                "Diffusers folder or single-file .safetensors checkpoint (default: the bundled demo model, models/demo)");
  c->add_option("--tokenizer", o.tokenizer, "Folder with the CLIP tokenizer (vocab.json, merges.txt) when the model has none");
  c->add_option("--prompt", r.prompt, "What to draw");
  c->add_option("--negative-prompt", r.negative_prompt, "What to avoid");
  c->add_option("--width", r.width, "Image width, a multiple of 8 (default: the model's size)");
  c->add_option("--height", r.height, "Image height, a multiple of 8 (default: the model's size)");
  c->add_option("--steps", r.steps, "Sampling steps")->capture_default_str();
  c->add_option("--cfg-scale", r.cfg_scale, "Classifier-free guidance scale (<= 1 disables it; FLUX: off unless given)")
      ->capture_default_str()
      ->each([&o](const std::string&) { o.cfg_given = true; });
  c->add_option("--sampler", r.sampler,
                "euler, euler_a, heun, ddim, dpmpp_2m, dpmpp_2m_sde, lcm (or A1111 names: \"Euler a\", \"DPM++ 2M Karras\"); "
                "the bundled demo model defaults to its own (ddim)")
      ->capture_default_str()
      ->each([&o](const std::string&) { o.sampler_given = true; });
  c->add_option("--schedule", r.schedule, "default, karras, exponential")->capture_default_str();
  c->add_option("--seed", r.seed, "Seed (-1: random)")->capture_default_str();
  c->add_option("--rng", r.rng, "cpu (torch CPU generator) or cuda (torch CUDA generator, A1111's default)")->capture_default_str();
  c->add_option("--clip-skip", r.clip_skip, "A1111 clip skip (1 = last layer)")->capture_default_str();
  c->add_option("--prediction", r.prediction, "Override the detected prediction type: epsilon or v");
  c->add_option("--init-image", r.init_image, "img2img: the starting image (PNG, JPEG, WebP)");
  c->add_option("--strength", r.strength, "img2img denoising strength in (0, 1]")->capture_default_str();
  c->add_option("--resize-mode", r.resize_mode,
                "img2img, an init image of another aspect ratio: resize (stretch), crop (cover, cut the overflow), "
                "fill (fit inside, fill the bands with its edges)")
      ->capture_default_str();
  c->add_option("--mask", r.mask, "Inpainting: a mask of the init image's size, white where to inpaint");
  c->add_option("--mask-blur", r.mask_blur_x, "Inpainting: Gaussian blur of the mask, in pixels")
      ->each([&r](const std::string&) { r.mask_blur_y = r.mask_blur_x; })
      ->capture_default_str();
  c->add_option("--inpaint-fill", r.inpaint_fill,
                "Inpainting: what the masked area starts from: original, fill (the colours around it), latent_noise, "
                "latent_nothing")
      ->capture_default_str();
  c->add_flag("--inpaint-only-masked", r.inpaint_only_masked,
              "Inpainting: generate only the box around the mask (plus --inpaint-padding), at the full size, and paste "
              "it back (A1111's \"Only masked\")");
  c->add_option("--inpaint-padding", r.inpaint_padding, "Inpainting: pixels around the mask's box with --inpaint-only-masked")
      ->capture_default_str();
  c->add_flag("--mask-invert", r.mask_invert, "Inpainting: inpaint where the mask is black instead");
  c->add_option("--batch-size", r.batch_size, "Images per batch")->capture_default_str();
  c->add_option("--batch-count", r.batch_count, "Batches, one after another")->capture_default_str();
  c->add_flag("--emphasis", r.emphasis, "Read A1111 (word:1.2) / [word] emphasis (default: literal, as diffusers)");
  c->add_option("--device", r.device, "cpu, cuda, cuda:N")->capture_default_str();
  c->add_option("--dtype", o.dtype,
                "Model compute dtype: auto (CPU f32, CUDA bf16), f32, bf16, f16 (CUDA only); fp8: FLUX and Z-Image "
                "transformer blocks in FP8 e4m3 (FP8 tensor cores on Hopper), the rest as auto")
      ->check(model_dtype_check())
      ->capture_default_str();
  c->add_option("--output", o.output, "Output PNG path; several images get -N suffixes")->capture_default_str();
  c->add_option("--trace", o.trace, "Write a Chrome/Perfetto trace (JSON) of every stage and op to this file");
  c->add_option("--guidance", o.guidance, "FLUX: distilled guidance scale")->capture_default_str();
  c->add_option("--max-sequence-length", o.max_sequence_length, "FLUX: T5 tokens, Z-Image: Qwen tokens (prompt padded/truncated)")->capture_default_str();
  c->add_option("--vae", o.vae, "FLUX: VAE file (ae.safetensors) or diffusers vae folder");
  c->add_option("--clip-l", o.clip_l, "FLUX: CLIP-L text encoder file or folder");
  c->add_option("--t5", o.t5, "FLUX: T5 text encoder file or folder");
  c->add_option("--t5-tokenizer", o.t5_tokenizer, "FLUX: T5 spiece.model (or its folder) when none is beside --t5");
  c->add_flag("--offload", o.offload,
              "FLUX, Z-Image: free the text encoders' device memory after encoding the prompt (for smaller cards; "
              "loaded again for the next prompt)");
  c->add_option("--components", o.components,
                "Z-Image: diffusers folder with tokenizer, text encoder, VAE and scheduler for a single-file transformer");
}

namespace {

std::string output_path(const std::string& base, size_t index, size_t count) {
  if (count == 1) return base;
  fs::path p(base);
  const std::string ext = p.has_extension() ? p.extension().string() : ".png";
  return (p.parent_path() / (p.stem().string() + "-" + std::to_string(index) + ext)).string();
}

}  // namespace

int run_generate(const GenerateOptions& o) {
  if (Status st = o.request.validate(); !st.is_ok()) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    return 2;
  }
  auto dev = Device::parse(o.request.device);
  if (!dev) {
    std::fprintf(stderr, "error: %s\n", dev.status().message().c_str());
    return 2;
  }
  switch (detect_model_family(o.model)) {
    case ModelFamily::kZImage: return run_generate_zimage(o, *dev);
    case ModelFamily::kFlux: return run_generate_flux(o, *dev);
    case ModelFamily::kSd: break;
  }
  if (o.fp8()) {
    std::fprintf(stderr, "error: --dtype fp8 is supported for FLUX and Z-Image models; SD models take auto, f32, bf16 or f16\n");
    return 2;
  }
  TraceFile trace_file(o.trace);
  trace_file.time_device(*dev);
  SdLoadOptions lo;
  lo.tokenizer_dir = o.tokenizer;
  lo.prediction = o.request.prediction;
  lo.device = *dev;
  lo.dtype = o.load_dtype();
  std::string model_path = o.model;
  GenerateRequest request = o.request;
  if (model_path.empty()) {
    auto demo = find_demo_model(executable_dir());
    if (!demo) {
      std::fprintf(stderr, "error: %s\n", demo.status().message().c_str());
      return 1;
    }
    model_path = *demo;
    if (!o.sampler_given) request.sampler = kDemoModelSampler;
  }
  auto model = load_sd_model(model_path, lo);
  if (!model) {
    std::fprintf(stderr, "error: %s\n", model.status().message().c_str());
    return 1;
  }
  SdPipeline pipe(*model);
  return finish_generate(o, pipe.generate(request, terminal_progress("batch")), trace_file, *dev);
}

ProgressCallback terminal_progress(const char* unit) {
  const bool tty = isatty(fileno(stderr));  // a progress line only where someone watches it
  return [tty, unit](const StepProgress& p) {
    if (!tty) return true;
    std::fprintf(stderr, "\r%s %d: step %d/%d", unit, p.batch_index + 1, p.call, p.total_calls);
    if (p.call == p.total_calls) std::fputc('\n', stderr);
    return true;
  };
}

int finish_generate(const GenerateOptions& o, const Expected<GenerateResult>& res, TraceFile& trace_file, Device device) {
  if (!res) {
    std::fprintf(stderr, "\nerror: %s\n", res.status().message().c_str());
    return 1;
  }
  if (int rc = write_generate_outputs(o, *res); rc != 0) return rc;
  return trace_file.write(device) ? 0 : 1;
}

int write_generate_outputs(const GenerateOptions& o, const GenerateResult& res) {
  for (size_t i = 0; i < res.images.size(); ++i) {
    const GeneratedImage& g = res.images[i];
    const std::string path = output_path(o.output, i, res.images.size());
    trace::Scope png_range("png_write", trace::Category::kStage, int64_t(i));
    if (Status st = write_png(path, g.image, {{"parameters", g.infotext}}); !st.is_ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 1;
    }
    const std::string sidecar = (fs::path(path).replace_extension(".json")).string();
    std::ofstream(sidecar) << g.info.dump(2) << "\n";
    std::printf("%s (seed %lld)\n", path.c_str(), static_cast<long long>(g.seed));
  }
  const StageTimes& t = res.times;
  std::fprintf(stderr, "text %.3f s, denoise %.3f s (%.1f ms/call), vae %.3f s, total %.3f s\n", t.text_encode_s,
               t.denoise_s, t.call_ms.empty() ? 0.0 : t.denoise_s * 1e3 / double(t.call_ms.size()), t.vae_s, t.total_s);
  return 0;
}

}  // namespace atelier::cli
