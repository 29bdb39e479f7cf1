// `atelier info` for FLUX.1 and Z-Image models, from their files alone: configs and safetensors headers (tensor
// shapes), no weights read, so that a 24 GB checkpoint is described in about the time its hash takes.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "pipeline/model_family.h"

namespace atelier {

// The model at `path` (a diffusers folder, or a single transformer file in BFL / Z-Image's original layout) ->
// {path, family, variant, layout, hash, components: {name: {class, parameters, config}}, parameters_total}.
// `hash`: the A1111 "Model hash" the pipelines write (first 10 hex digits of the SHA-256 of the transformer's first
// weight file). Components without weights (scheduler, tokenizers) have no "parameters". `family`: kFlux or kZImage.
Expected<nlohmann::json> describe_dit_model(const std::string& path, ModelFamily family);

}  // namespace atelier
