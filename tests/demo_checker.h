// Prompt-adherence checker for the demo model's images (C++ twin of tools/demo_model/check.py: same rules and
// constants, so CI needs no torch). A prompt is the generator's caption grammar:
//   "<a|an|one|two|three> [small|large] <colour> <shape>[s] [on the left|...] on a <colour> background"
// and an image passes when everything the prompt names is what the image shows:
//   background  the palette colour most border pixels are nearest to;
//   objects     4-connected components of the pixels farther than kFgThreshold from the background colour,
//               at least kMinAreaFrac of the image each; their number is the count;
//   colour      the palette colour (other than the background) most object pixels are nearest to;
//   shape       per object: solidity (area / convex hull) < 0.75 star, else fill of the bounding box > 0.9
//               square, > 0.64 circle, else triangle (drawn: star 0.56 / 0.39, square 1, circle 0.785,
//               triangle 0.5); the majority over objects;
//   size        mean bounding-box side / image side below 0.255 is small (drawn at 0.17 and 0.34);
//   position    the objects' centroid: left x < 0.4, right x > 0.6, top y < 0.4, bottom y > 0.6, center
//               within 0.12 of the middle on both axes.
#pragma once
#include <string>
#include <vector>

#include "io/image.h"

namespace atelier::demo {

// The generator's palette (tools/demo_model/shapes.py COLOURS), in its order.
struct NamedColour {
  const char* name;
  int r, g, b;
};
const std::vector<NamedColour>& palette();

// What a prompt names; "" / 0 where it names nothing.
struct SceneSpec {
  std::string background, colour, shape, size, position;
  int count = 0;
};
SceneSpec parse_prompt(const std::string& prompt);

// What an image shows.
struct SceneFound {
  std::string background, colour, shape, size;
  int count = 0;
  double cx = 0, cy = 0;  // centroid of all object pixels, as fractions of the width / height
};
// img: RGB or RGBA, any size.
SceneFound analyse(const Image& img);

struct CheckResult {
  bool passed = false;
  SceneSpec expected;
  SceneFound found;
  std::string describe() const;  // "background blue, 1 red circle (large) at (0.51, 0.48)"
};
CheckResult check(const Image& img, const std::string& prompt);

// Whether a centroid (fractions of the image) is at `position` (left/right/top/bottom/center).
bool position_matches(const std::string& position, double cx, double cy);

}  // namespace atelier::demo
