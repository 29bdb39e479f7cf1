// A small Jinja interpreter for chat templates (chat_template.jinja / tokenizer_config.json's
// "chat_template"), rendering as transformers' apply_chat_template does (jinja2 with trim_blocks and
// lstrip_blocks). The subset:
//   - text, {{ expr }}, {# comments #}, whitespace control with '-' on either side of a tag;
//   - {% if %} / {% elif %} / {% else %} / {% endif %}, {% for x in expr %} ... {% endfor %} (with
//     loop.index, loop.index0, loop.first, loop.last), {% set name = expr %};
//   - expressions: string/integer/true/false/none literals, names, attribute and subscript access,
//     not / and / or, == != in / not in, + and ~ concatenation, tests (is [not] defined / none / true /
//     false / string), filters | trim and | length, parentheses.
// Anything else is reported as unsupported, naming the construct.
#pragma once
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace atelier {

// Renders `tmpl` with the variables of `context` (a JSON object).
Expected<std::string> render_chat_template(const std::string& tmpl, const nlohmann::json& context);

// messages = [{"role": "user", "content": prompt}], add_generation_prompt = True and enable_thinking, as
// diffusers' ZImagePipeline passes them.
Expected<std::string> apply_chat_template(const std::string& tmpl, const std::string& prompt, bool enable_thinking);

// What Qwen's ChatML templates render for that same single user message:
// "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n" (+ "<think>\n\n</think>\n\n" when
// enable_thinking is false). Qwen3's full template (tools, namespace(), reverse loops) is beyond the subset
// above, and renders exactly this when no tools and no system message are given; the pipeline falls back
// to it for ChatML templates the subset cannot run.
std::string chatml_user_prompt(const std::string& prompt, bool enable_thinking);
// True when `tmpl` is a ChatML template (uses <|im_start|> and <|im_end|>).
bool is_chatml_template(const std::string& tmpl);

}  // namespace atelier
