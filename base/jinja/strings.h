#pragma once
// Python str operations on tainted strings (tstring.h): results that are substrings keep their
// ranges exactly (strip, split, replace's kept parts); rewritten text is tainted wholly.
#include <string>
#include <vector>

#include "base/jinja/value.h"

namespace fathom::jinja {

class Interp;

// str.strip / lstrip / rstrip; chars null: Unicode whitespace.
TString py_strip(const TString& s, const std::string* chars, bool left, bool right);
// str.split / rsplit; sep null: runs of whitespace, empty parts dropped.
std::vector<TString> py_split(const TString& s, const std::string* sep, int64_t maxsplit, bool from_right);
std::vector<TString> py_splitlines(const TString& s);
// str.replace: the unchanged parts keep their ranges, each inserted `repl` keeps its own.
TString py_replace(Interp& in, const TString& s, const std::string& old, const TString& repl, int64_t count);
// str.format with {} / {0} / {name} fields (no format specs).
TString py_format(Interp& in, const TString& s, const CallArgs& args);
// printf-style 'fmt' % args: %s %r %d %i %f %% (with flags, width, precision).
TString py_percent_format(Interp& in, const TString& fmt, const Value& args);
// markupsafe.escape of a plain string (& < > " ').
TString html_escape(const TString& s);
bool py_is(const std::string& method, const std::string& s);
// str.upper / lower / swapcase (ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic).
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_swapcase(const std::string& s);
std::string py_title(const std::string& s);       // str.title()
std::string py_capitalize(const std::string& s);  // str.capitalize()

}  // namespace fathom::jinja
