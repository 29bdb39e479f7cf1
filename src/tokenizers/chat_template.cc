#include "tokenizers/chat_template.h"

#include <cctype>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

namespace atelier {
namespace {

using nlohmann::json;

// --- lexing the template into text, {{ }} and {% %} segments ------------------------------------------

enum class SegKind { kText, kExpr, kStmt };
struct Segment {
  SegKind kind;
  std::string body;  // text, or the tag's inside without delimiters and '-' markers
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Splits `t` into segments, applying '-' whitespace control and jinja2's trim_blocks (the newline right
// after a block tag is dropped) and lstrip_blocks (spaces and tabs from a line start up to a block tag
// are dropped), as transformers configures its environment.
Expected<std::vector<Segment>> lex(const std::string& t) {
  std::vector<Segment> out;
  bool strip_next = false, trim_newline = false;
  size_t pos = 0;
  auto flush_text = [&](std::string s) {
    if (strip_next) s.erase(0, s.find_first_not_of(" \t\r\n") == std::string::npos ? s.size() : s.find_first_not_of(" \t\r\n"));
    else if (trim_newline && s.starts_with("\n")) s.erase(0, 1);
    else if (trim_newline && s.starts_with("\r\n")) s.erase(0, 2);
    strip_next = trim_newline = false;
    return s;
  };
  while (pos <= t.size()) {
    const size_t p = t.find('{', pos);
    const bool tag = p != std::string::npos && p + 1 < t.size() && (t[p + 1] == '{' || t[p + 1] == '%' || t[p + 1] == '#');
    if (p == std::string::npos) {
      std::string s = flush_text(t.substr(pos));
      if (!s.empty()) out.push_back({SegKind::kText, s});
      break;
    }
    if (!tag) {  // a lone '{' is text
      std::string s = flush_text(t.substr(pos, p + 1 - pos));
      if (!s.empty()) out.push_back({SegKind::kText, s});
      pos = p + 1;
      continue;
    }
    const char open = t[p + 1];
    const std::string close = open == '{' ? "}}" : open == '%' ? "%}" : "#}";
    const size_t end = t.find(close, p + 2);
    if (end == std::string::npos) return invalid_argument("chat template: unclosed tag at offset " + std::to_string(p));
    std::string s = flush_text(t.substr(pos, p - pos));
    const bool left_dash = p + 2 < end && t[p + 2] == '-';
    const bool right_dash = end > p + 2 && t[end - 1] == '-';
    const bool block = open != '{';
    if (left_dash) {
      while (!s.empty() && is_space(s.back())) s.pop_back();
    } else if (block) {  // lstrip_blocks: judged on the source, before trim_blocks touched the text
      size_t q = p;
      while (q > pos && (t[q - 1] == ' ' || t[q - 1] == '\t')) --q;
      if (q == 0 || t[q - 1] == '\n')
        for (size_t k = q; k < p && !s.empty() && (s.back() == ' ' || s.back() == '\t'); ++k) s.pop_back();
    }
    if (!s.empty()) out.push_back({SegKind::kText, s});
    const size_t b0 = p + 2 + (left_dash ? 1 : 0), b1 = end - (right_dash ? 1 : 0);
    if (open == '{') out.push_back({SegKind::kExpr, t.substr(b0, b1 - b0)});
    if (open == '%') out.push_back({SegKind::kStmt, t.substr(b0, b1 - b0)});
    strip_next = right_dash;
    trim_newline = block && !right_dash;
    pos = end + 2;
    if (pos == t.size()) break;
  }
  return out;
}

// --- expressions ---------------------------------------------------------------------------------------

struct Tok {
  enum Kind { kName, kString, kInt, kOp, kEnd } kind;
  std::string s;
  long long i = 0;
};

Expected<std::vector<Tok>> tokenize_expr(const std::string& e) {
  std::vector<Tok> out;
  for (size_t i = 0; i < e.size();) {
    const char c = e[i];
    if (is_space(c)) { ++i; continue; }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < e.size() && (std::isalnum(static_cast<unsigned char>(e[j])) || e[j] == '_')) ++j;
      out.push_back({Tok::kName, e.substr(i, j - i)});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < e.size() && std::isdigit(static_cast<unsigned char>(e[j]))) ++j;
      out.push_back({Tok::kInt, "", std::stoll(e.substr(i, j - i))});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string s;
      size_t j = i + 1;
      for (; j < e.size() && e[j] != c; ++j) {
        if (e[j] == '\\' && j + 1 < e.size()) {
          const char n = e[++j];
          s += n == 'n' ? '\n' : n == 't' ? '\t' : n;
        } else {
          s += e[j];
        }
      }
      if (j >= e.size()) return invalid_argument("chat template: unterminated string in '" + e + "'");
      out.push_back({Tok::kString, s});
      i = j + 1;
    } else if ((c == '=' || c == '!') && i + 1 < e.size() && e[i + 1] == '=') {
      out.push_back({Tok::kOp, e.substr(i, 2)});
      i += 2;
    } else if (std::string("()[].|~+,=").find(c) != std::string::npos) {
      out.push_back({Tok::kOp, std::string(1, c)});
      ++i;
    } else {
      return unsupported(std::string("chat template: operator '") + c + "' is not supported, in '" + e + "'");
    }
  }
  out.push_back({Tok::kEnd, ""});
  return out;
}

// A value: JSON, or Jinja's undefined.
struct Val {
  bool undefined = false;
  json j;
};

bool truthy(const Val& v) {
  if (v.undefined || v.j.is_null()) return false;
  if (v.j.is_boolean()) return v.j.get<bool>();
  if (v.j.is_number()) return v.j.get<double>() != 0;
  if (v.j.is_string() || v.j.is_array() || v.j.is_object()) return !v.j.empty();
  return true;
}

std::string to_text(const Val& v) {
  if (v.undefined) return "";
  if (v.j.is_string()) return v.j.get<std::string>();
  if (v.j.is_boolean()) return v.j.get<bool>() ? "True" : "False";
  if (v.j.is_null()) return "None";
  return v.j.dump();
}

using Scope = std::vector<json>;  // innermost last; each an object of names

// Recursive-descent evaluator over one expression's tokens.
class Eval {
 public:
  Eval(const std::vector<Tok>& toks, const Scope& scope) : t_(toks), scope_(scope) {}
  Val run() {
    Val v = or_expr();
    if (t_[i_].kind != Tok::kEnd) fail("unexpected '" + t_[i_].s + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& m) { throw Error(unsupported("chat template expression: " + m)); }
  bool name_is(const char* s) const { return t_[i_].kind == Tok::kName && t_[i_].s == s; }
  bool op_is(const char* s) const { return t_[i_].kind == Tok::kOp && t_[i_].s == s; }
  void expect_op(const char* s) {
    if (!op_is(s)) fail(std::string("expected '") + s + "'");
    ++i_;
  }
  Val or_expr() {
    Val v = and_expr();
    while (name_is("or")) { ++i_; Val r = and_expr(); v = Val{false, truthy(v) || truthy(r)}; }
    return v;
  }
  Val and_expr() {
    Val v = not_expr();
    while (name_is("and")) { ++i_; Val r = not_expr(); v = Val{false, truthy(v) && truthy(r)}; }
    return v;
  }
  Val not_expr() {
    if (name_is("not")) { ++i_; return Val{false, !truthy(not_expr())}; }
    return compare();
  }
  Val compare() {
    Val a = concat();
    if (op_is("==") || op_is("!=")) {
      const bool eq = t_[i_++].s == "==";
      Val b = concat();
      const bool same = a.undefined == b.undefined && a.j == b.j;
      return Val{false, eq == same};
    }
    const bool neg_in = name_is("not") && t_[i_ + 1].kind == Tok::kName && t_[i_ + 1].s == "in";
    if (name_is("in") || neg_in) {
      i_ += neg_in ? 2 : 1;
      Val b = concat();
      bool found = false;
      if (b.j.is_string() && a.j.is_string()) found = b.j.get<std::string>().find(a.j.get<std::string>()) != std::string::npos;
      else if (b.j.is_array()) for (const json& x : b.j) found = found || x == a.j;
      else if (b.j.is_object() && a.j.is_string()) found = b.j.contains(a.j.get<std::string>());
      return Val{false, found != neg_in};
    }
    if (name_is("is")) {
      ++i_;
      const bool neg = name_is("not");
      if (neg) ++i_;
      if (t_[i_].kind != Tok::kName) fail("expected a test name after 'is'");
      const std::string test = t_[i_++].s;
      bool r;
      if (test == "defined") r = !a.undefined;
      else if (test == "none") r = !a.undefined && a.j.is_null();
      else if (test == "true") r = !a.undefined && a.j.is_boolean() && a.j.get<bool>();
      else if (test == "false") r = !a.undefined && a.j.is_boolean() && !a.j.get<bool>();
      else if (test == "string") r = !a.undefined && a.j.is_string();
      else fail("test '" + test + "' is not supported");
      return Val{false, r != neg};
    }
    return a;
  }
  Val concat() {
    Val v = postfix();
    while (op_is("+") || op_is("~")) {
      const bool tilde = t_[i_++].s == "~";
      Val r = postfix();
      if (tilde || (v.j.is_string() && r.j.is_string())) v = Val{false, to_text(v) + to_text(r)};
      else if (v.j.is_number_integer() && r.j.is_number_integer()) v = Val{false, v.j.get<long long>() + r.j.get<long long>()};
      else fail("'+' needs two strings or two integers");
    }
    return v;
  }
  Val member(const Val& v, const json& key) {
    if (v.undefined) return Val{true, {}};
    if (v.j.is_object() && key.is_string() && v.j.contains(key.get<std::string>())) return Val{false, v.j.at(key.get<std::string>())};
    if (v.j.is_array() && key.is_number_integer()) {
      long long k = key.get<long long>();
      if (k < 0) k += (long long)v.j.size();
      if (k >= 0 && k < (long long)v.j.size()) return Val{false, v.j.at(size_t(k))};
    }
    return Val{true, {}};
  }
  Val postfix() {
    Val v = primary();
    for (;;) {
      if (op_is(".")) {
        ++i_;
        if (t_[i_].kind != Tok::kName) fail("expected a name after '.'");
        v = member(v, t_[i_++].s);
      } else if (op_is("[")) {
        ++i_;
        Val k = or_expr();
        expect_op("]");
        v = member(v, k.j);
      } else if (op_is("|")) {
        ++i_;
        if (t_[i_].kind != Tok::kName) fail("expected a filter name after '|'");
        const std::string f = t_[i_++].s;
        if (f == "trim") {
          std::string s = to_text(v);
          const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
          v = Val{false, a == std::string::npos ? std::string() : s.substr(a, b - a + 1)};
        } else if (f == "length") {
          v = Val{false, v.undefined ? 0 : (long long)v.j.size()};
        } else {
          fail("filter '" + f + "' is not supported");
        }
      } else {
        return v;
      }
    }
  }
  Val primary() {
    const Tok& k = t_[i_];
    if (k.kind == Tok::kString) { ++i_; return Val{false, k.s}; }
    if (k.kind == Tok::kInt) { ++i_; return Val{false, k.i}; }
    if (op_is("(")) {
      ++i_;
      Val v = or_expr();
      expect_op(")");
      return v;
    }
    if (k.kind != Tok::kName) fail("unexpected '" + k.s + "'");
    ++i_;
    if (k.s == "true" || k.s == "True") return Val{false, true};
    if (k.s == "false" || k.s == "False") return Val{false, false};
    if (k.s == "none" || k.s == "None") return Val{false, nullptr};
    if (op_is("(")) fail("function calls ('" + k.s + "(...)') are not supported");
    for (auto it = scope_.rbegin(); it != scope_.rend(); ++it)
      if (it->contains(k.s)) return Val{false, it->at(k.s)};
    return Val{true, {}};
  }

  const std::vector<Tok>& t_;
  const Scope& scope_;
  size_t i_ = 0;
};

// --- statements ----------------------------------------------------------------------------------------

struct Node {
  enum Kind { kText, kExpr, kIf, kFor, kSet } kind;
  std::string text = {};                             // kText; kFor: loop variable; kSet: name
  std::vector<Tok> expr = {};                        // kExpr, kFor (iterable), kSet (value)
  std::vector<std::pair<std::vector<Tok>, std::vector<Node>>> branches = {};  // kIf (else: empty condition)
  std::vector<Node> body = {};                       // kFor
};

std::string first_word(const std::string& s, std::string* rest) {
  size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  size_t b = a;
  while (b < s.size() && !is_space(s[b])) ++b;
  if (rest) *rest = s.substr(b);
  return s.substr(a, b - a);
}

// Parses segments from `i` until one of `ends` (a statement keyword); returns the keyword met ("" at EOF).
std::string parse_block(const std::vector<Segment>& segs, size_t& i, std::vector<Node>& out, const std::vector<std::string>& ends) {
  while (i < segs.size()) {
    const Segment& s = segs[i++];
    if (s.kind == SegKind::kText) { out.push_back({Node::kText, s.body}); continue; }
    if (s.kind == SegKind::kExpr) { out.push_back({Node::kExpr, "", tokenize_expr(s.body).value()}); continue; }
    std::string rest;
    const std::string kw = first_word(s.body, &rest);
    for (const auto& e : ends)
      if (kw == e) { --i; return kw; }
    if (kw == "if") {
      Node n{Node::kIf};
      std::vector<Tok> cond = tokenize_expr(rest).value();
      for (;;) {
        std::vector<Node> body;
        const std::string end = parse_block(segs, i, body, {"elif", "else", "endif"});
        n.branches.emplace_back(cond, std::move(body));
        if (end.empty()) throw Error(invalid_argument("chat template: {% if %} without {% endif %}"));
        std::string r;
        first_word(segs[i++].body, &r);
        if (end == "endif") break;
        cond = end == "elif" ? tokenize_expr(r).value() : std::vector<Tok>{};
      }
      out.push_back(std::move(n));
    } else if (kw == "for") {
      std::string r;
      Node n{Node::kFor};
      n.text = first_word(rest, &r);
      std::string r2;
      if (first_word(r, &r2) != "in") throw Error(unsupported("chat template: only 'for name in expr' loops are supported"));
      n.expr = tokenize_expr(r2).value();
      if (parse_block(segs, i, n.body, {"endfor"}).empty()) throw Error(invalid_argument("chat template: {% for %} without {% endfor %}"));
      ++i;
      out.push_back(std::move(n));
    } else if (kw == "set") {
      const size_t eq = rest.find('=');
      if (eq == std::string::npos) throw Error(unsupported("chat template: only '{% set name = expr %}' is supported"));
      Node n{Node::kSet};
      n.text = first_word(rest.substr(0, eq), nullptr);
      n.expr = tokenize_expr(rest.substr(eq + 1)).value();
      out.push_back(std::move(n));
    } else {
      throw Error(unsupported("chat template: statement '{% " + kw + " %}' is not supported"));
    }
  }
  return "";
}

void render(const std::vector<Node>& nodes, Scope& scope, std::string& out) {
  for (const Node& n : nodes) {
    switch (n.kind) {
      case Node::kText: out += n.text; break;
      case Node::kExpr: out += to_text(Eval(n.expr, scope).run()); break;
      case Node::kSet: scope.back()[n.text] = Eval(n.expr, scope).run().j; break;
      case Node::kIf:
        for (const auto& [cond, body] : n.branches)
          if (cond.empty() || truthy(Eval(cond, scope).run())) {
            render(body, scope, out);
            break;
          }
        break;
      case Node::kFor: {
        const Val it = Eval(n.expr, scope).run();
        if (it.undefined || it.j.is_null()) break;
        if (!it.j.is_array()) throw Error(unsupported("chat template: for loops run over lists only"));
        const size_t count = it.j.size();
        for (size_t k = 0; k < count; ++k) {
          json frame = json::object();
          frame[n.text] = it.j[k];
          frame["loop"] = {{"index0", k}, {"index", k + 1}, {"first", k == 0}, {"last", k + 1 == count}, {"length", count}};
          scope.push_back(std::move(frame));
          render(n.body, scope, out);
          scope.pop_back();
        }
        break;
      }
    }
  }
}

}  // namespace

Expected<std::string> render_chat_template(const std::string& tmpl, const json& context) {
  std::string out;
  Status st = catch_status([&]() -> Status {
    ATELIER_ASSIGN_OR_RETURN(auto segs, lex(tmpl));
    std::vector<Node> nodes;
    size_t i = 0;
    const std::string stray = parse_block(segs, i, nodes, {"elif", "else", "endif", "endfor"});
    if (!stray.empty()) return invalid_argument("chat template: unexpected {% " + stray + " %}");
    Scope scope{context, json::object()};
    render(nodes, scope, out);
    return Status::ok();
  });
  if (!st) return st;
  return out;
}

Expected<std::string> apply_chat_template(const std::string& tmpl, const std::string& prompt, bool enable_thinking) {
  json ctx = {{"messages", json::array({{{"role", "user"}, {"content", prompt}}})},
              {"add_generation_prompt", true},
              {"enable_thinking", enable_thinking}};
  return render_chat_template(tmpl, ctx);
}

std::string chatml_user_prompt(const std::string& prompt, bool enable_thinking) {
  std::string out = "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n";
  if (!enable_thinking) out += "<think>\n\n</think>\n\n";
  return out;
}

bool is_chatml_template(const std::string& tmpl) {
  return tmpl.find("<|im_start|>") != std::string::npos && tmpl.find("<|im_end|>") != std::string::npos;
}

}  // namespace atelier
