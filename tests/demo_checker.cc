#include "demo_checker.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <utility>

namespace atelier::demo {
namespace {

constexpr double kFgThreshold = 60.0;     // RGB distance from the background colour that makes a pixel foreground
constexpr double kMinAreaFrac = 0.004;    // smaller components are noise (a small drawn shape covers > 0.009)
constexpr int kBorder = 2;                // border rows/columns that vote for the background
constexpr double kStarSolidity = 0.75;
constexpr double kSquareFill = 0.9;
constexpr double kCircleFill = 0.64;
constexpr double kSmallLargeSplit = 0.255;
constexpr double kSideSplit = 0.4;
constexpr double kCenterTol = 0.12;

struct Pixel {
  int r, g, b;
};

Pixel pixel(const Image& img, int x, int y) {
  const uint8_t* p = &img.pixels[(size_t(y) * img.width + x) * img.channels];
  if (img.channels < 3) return {p[0], p[0], p[0]};
  return {p[0], p[1], p[2]};
}

double dist2(const Pixel& p, const NamedColour& c) {
  const double dr = p.r - c.r, dg = p.g - c.g, db = p.b - c.b;
  return dr * dr + dg * dg + db * db;
}

// Index of the palette colour nearest to `p`, skipping `exclude` (-1: none).
int nearest(const Pixel& p, int exclude = -1) {
  int best = -1;
  double best_d = std::numeric_limits<double>::max();
  for (int i = 0; i < int(palette().size()); ++i) {
    if (i == exclude) continue;
    const double d = dist2(p, palette()[i]);
    if (d < best_d) best_d = d, best = i;
  }
  return best;
}

int argmax(const std::vector<int>& votes) { return int(std::max_element(votes.begin(), votes.end()) - votes.begin()); }

// One 4-connected component: its pixels as (x, y).
using Component = std::vector<std::pair<int, int>>;

std::vector<Component> components(const std::vector<uint8_t>& mask, int w, int h) {
  std::vector<uint8_t> seen(mask.size(), 0);
  std::vector<Component> out;
  for (int y0 = 0; y0 < h; ++y0) {
    for (int x0 = 0; x0 < w; ++x0) {
      if (!mask[size_t(y0) * w + x0] || seen[size_t(y0) * w + x0]) continue;
      Component c;
      std::vector<std::pair<int, int>> stack{{x0, y0}};
      seen[size_t(y0) * w + x0] = 1;
      while (!stack.empty()) {
        const auto [x, y] = stack.back();
        stack.pop_back();
        c.emplace_back(x, y);
        const std::array<std::pair<int, int>, 4> next{{{x - 1, y}, {x + 1, y}, {x, y - 1}, {x, y + 1}}};
        for (const auto& [nx, ny] : next) {
          if (nx < 0 || ny < 0 || nx >= w || ny >= h) continue;
          const size_t i = size_t(ny) * w + nx;
          if (mask[i] && !seen[i]) seen[i] = 1, stack.emplace_back(nx, ny);
        }
      }
      out.push_back(std::move(c));
    }
  }
  return out;
}

// Area of the convex hull of the pixels' corner points (monotone chain), so a filled square's hull is its area.
double hull_area(const Component& c) {
  std::set<std::pair<int, int>> corner_set;
  for (const auto& [x, y] : c)
    for (int dy = 0; dy < 2; ++dy)
      for (int dx = 0; dx < 2; ++dx) corner_set.emplace(x + dx, y + dy);
  std::vector<std::pair<int, int>> pts(corner_set.begin(), corner_set.end());
  if (pts.size() < 3) return 0.0;
  auto cross = [](auto o, auto a, auto b) {
    return double(a.first - o.first) * (b.second - o.second) - double(a.second - o.second) * (b.first - o.first);
  };
  std::vector<std::pair<int, int>> hull(2 * pts.size());
  size_t k = 0;
  for (size_t i = 0; i < pts.size(); ++i) {
    while (k >= 2 && cross(hull[k - 2], hull[k - 1], pts[i]) <= 0) --k;
    hull[k++] = pts[i];
  }
  for (size_t i = pts.size() - 1, lower = k + 1; i-- > 0;) {
    while (k >= lower && cross(hull[k - 2], hull[k - 1], pts[i]) <= 0) --k;
    hull[k++] = pts[i];
  }
  hull.resize(k - 1);
  double area = 0;
  for (size_t i = 0; i < hull.size(); ++i) {
    const auto& a = hull[i];
    const auto& b = hull[(i + 1) % hull.size()];
    area += double(a.first) * b.second - double(b.first) * a.second;
  }
  return std::abs(area) / 2.0;
}

struct Box {
  int x0, y0, x1, y1;  // inclusive
  int side() const { return std::max(x1 - x0 + 1, y1 - y0 + 1); }
  double area() const { return double(x1 - x0 + 1) * (y1 - y0 + 1); }
};

Box bounding_box(const Component& c) {
  Box b{c[0].first, c[0].second, c[0].first, c[0].second};
  for (const auto& [x, y] : c) b = {std::min(b.x0, x), std::min(b.y0, y), std::max(b.x1, x), std::max(b.y1, y)};
  return b;
}

std::string classify_shape(const Component& c) {
  const double area = double(c.size());
  const double fill = area / bounding_box(c).area();
  const double solidity = area / std::max(hull_area(c), 1.0);
  if (solidity < kStarSolidity) return "star";
  if (fill > kSquareFill) return "square";
  return fill > kCircleFill ? "circle" : "triangle";
}

int background_index(const Image& img) {
  std::vector<int> votes(palette().size(), 0);
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x)
      if (x < kBorder || y < kBorder || x >= img.width - kBorder || y >= img.height - kBorder)
        ++votes[nearest(pixel(img, x, y))];
  return argmax(votes);
}

}  // namespace

const std::vector<NamedColour>& palette() {
  static const std::vector<NamedColour> kPalette = {
      {"red", 215, 35, 35},  {"orange", 250, 140, 20}, {"yellow", 250, 230, 40}, {"green", 40, 170, 60},
      {"blue", 40, 80, 225}, {"purple", 140, 50, 180}, {"white", 245, 245, 245}, {"black", 25, 25, 25}};
  return kPalette;
}

SceneSpec parse_prompt(const std::string& prompt) {
  std::vector<std::string> words;
  std::istringstream in(prompt);
  for (std::string w; in >> w;) {
    std::transform(w.begin(), w.end(), w.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
    words.push_back(w);
  }
  SceneSpec s;
  static const std::map<std::string, int> kCounts = {{"a", 1}, {"an", 1}, {"one", 1}, {"two", 2}, {"three", 3}};
  static const std::set<std::string> kShapes = {"circle", "square", "triangle", "star"};
  static const std::set<std::string> kPositions = {"left", "right", "top", "bottom", "center"};
  auto is_colour = [](const std::string& w) {
    return std::any_of(palette().begin(), palette().end(), [&](const NamedColour& c) { return w == c.name; });
  };
  if (!words.empty() && kCounts.count(words[0])) s.count = kCounts.at(words[0]);
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    const std::string singular = !w.empty() && w.back() == 's' ? w.substr(0, w.size() - 1) : w;
    if (w == "small" || w == "large") s.size = w;
    else if (kShapes.count(singular) && s.shape.empty()) s.shape = singular;
    else if (kPositions.count(w)) s.position = w;
    else if (w == "background" && i > 0 && is_colour(words[i - 1])) s.background = words[i - 1];
    else if (is_colour(w) && s.colour.empty() && !(i + 1 < words.size() && words[i + 1] == "background")) s.colour = w;
  }
  return s;
}

SceneFound analyse(const Image& img) {
  SceneFound f;
  const int w = img.width, h = img.height;
  const int bg = background_index(img);
  f.background = palette()[bg].name;
  std::vector<uint8_t> mask(size_t(w) * h, 0);
  const double threshold2 = kFgThreshold * kFgThreshold;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) mask[size_t(y) * w + x] = dist2(pixel(img, x, y), palette()[bg]) > threshold2;
  std::vector<Component> objects;
  for (auto& c : components(mask, w, h))
    if (double(c.size()) >= kMinAreaFrac * w * h) objects.push_back(std::move(c));
  f.count = int(objects.size());
  if (objects.empty()) return f;
  std::vector<int> colour_votes(palette().size(), 0);
  std::map<std::string, int> shape_votes;
  double sx = 0, sy = 0, side_sum = 0;
  size_t n = 0;
  for (const auto& c : objects) {
    for (const auto& [x, y] : c) {
      ++colour_votes[nearest(pixel(img, x, y), bg)];
      sx += x, sy += y, ++n;
    }
    ++shape_votes[classify_shape(c)];
    side_sum += bounding_box(c).side();
  }
  f.colour = palette()[argmax(colour_votes)].name;
  f.shape = std::max_element(shape_votes.begin(), shape_votes.end(),
                             [](const auto& a, const auto& b) { return a.second < b.second; })->first;
  f.size = side_sum / double(objects.size()) / w < kSmallLargeSplit ? "small" : "large";
  f.cx = sx / double(n) / w;
  f.cy = sy / double(n) / h;
  return f;
}

bool position_matches(const std::string& position, double cx, double cy) {
  if (position == "center") return std::abs(cx - 0.5) < kCenterTol && std::abs(cy - 0.5) < kCenterTol;
  if (position == "left") return cx < kSideSplit;
  if (position == "right") return cx > 1 - kSideSplit;
  if (position == "top") return cy < kSideSplit;
  if (position == "bottom") return cy > 1 - kSideSplit;
  return false;
}

CheckResult check(const Image& img, const std::string& prompt) {
  CheckResult r;
  r.expected = parse_prompt(prompt);
  r.found = analyse(img);
  const SceneSpec& e = r.expected;
  const SceneFound& f = r.found;
  auto named_ok = [](const std::string& want, const std::string& got) { return want.empty() || want == got; };
  r.passed = named_ok(e.background, f.background) && named_ok(e.colour, f.colour) && named_ok(e.shape, f.shape) &&
             named_ok(e.size, f.size) && (e.count == 0 || e.count == f.count) &&
             (e.position.empty() || (f.count > 0 && position_matches(e.position, f.cx, f.cy)));
  return r;
}

std::string CheckResult::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "background %s, %d %s %s (%s) at (%.2f, %.2f)", found.background.c_str(), found.count,
                found.colour.c_str(), found.shape.c_str(), found.size.c_str(), found.cx, found.cy);
  return buf;
}

}  // namespace atelier::demo
