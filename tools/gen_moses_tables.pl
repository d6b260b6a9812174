#!/usr/bin/env perl
# Writes src/metrics/moses_tables.cc: the data the Moses tokenizer of src/metrics/
# moses_tokenize.cc needs to reproduce mosesdecoder's scripts/tokenizer/tokenizer.perl.
#
#   perl tools/gen_moses_tables.pl MOSESDECODER > src/metrics/moses_tables.cc
#
# MOSESDECODER is a checkout of github.com/moses-smt/mosesdecoder (only
# scripts/share/nonbreaking_prefixes/ is read).
#
# Why Perl: tokenizer.perl's character classes are Perl's, and Perl's are not Python's
# (Perl's \p{IsAlnum} is Unicode's Alphabetic property plus decimal digits, Python's
# str.isalnum() is the letter and number categories; Perl's \s lacks U+001C..U+001F,
# which Python's str.isspace() has). So every class is read off the Perl that runs this,
# code point by code point, on UTF-8 strings as tokenizer.perl reads them (binmode :utf8),
# and the output names that Perl's Unicode version. \p{IsN} (the general category N)
# is not written again: it is unicode::kNumber of src/metrics/unicode_tables.cc, and this
# script checks that Perl agrees with that table, code point by code point.
#
# The nonbreaking prefixes are read with tokenizer.perl's own rules (load_prefixes): a
# line is skipped when empty, when it is "0" (Perl false) or when it starts with "#";
# "WORD #NUMERIC_ONLY#" marks WORD (everything before the last run of whitespace before
# the marker, trailing whitespace kept as Perl's greedy (.*) keeps it) as breaking only
# before a digit (kind 2); any other line is a prefix as it stands (kind 1). Only German
# and French are written: the target languages of the paper's WMT14 tasks.
use strict;
use warnings;
use feature 'unicode_strings';

my $moses = shift @ARGV;
die "usage: perl tools/gen_moses_tables.pl MOSESDECODER > src/metrics/moses_tables.cc\n"
  unless defined $moses && !@ARGV;
my $prefix_dir = "$moses/scripts/share/nonbreaking_prefixes";
die "gen_moses_tables: no $prefix_dir\n" unless -d $prefix_dir;
(my $unicode_tables = $0) =~ s{[^/]*$}{../src/metrics/unicode_tables.cc};

binmode(STDOUT, ':utf8');

# Closed ranges [first, last] of the code points (surrogates left out: UTF-8 cannot
# carry them) whose one-character string matches $pattern.
sub ranges_of {
  my ($pattern) = @_;
  my @ranges;
  my $start;
  for my $cp (0 .. 0x110000) {
    my $inside = 0;
    if ($cp <= 0x10FFFF && !($cp >= 0xD800 && $cp <= 0xDFFF)) {
      my $text = chr($cp);
      utf8::upgrade($text);  # a character string, as the :utf8 layer gives tokenizer.perl
      $inside = $text =~ $pattern ? 1 : 0;
    }
    if ($inside && !defined $start) {
      $start = $cp;
    } elsif (!$inside && defined $start) {
      push @ranges, [$start, $cp - 1];
      undef $start;
    }
  }
  return \@ranges;
}

sub emit_ranges {
  my ($name, $what, $ranges) = @_;
  print "// $what\n";
  print "const unicode::CodePointRange ${name}[] = {\n";
  for (my $i = 0; $i < @$ranges; $i += 4) {
    my @row = map { sprintf('{0x%04X, 0x%04X}', @$_) } @$ranges[$i .. ($i + 3 < $#$ranges ? $i + 3 : $#$ranges)];
    print '    ', join(', ', @row), ",\n";
  }
  print "};\n";
  print "const std::size_t ${name}_size = sizeof($name) / sizeof(${name}[0]);\n\n";
}

# unicode::kNumber as written in src/metrics/unicode_tables.cc.
sub python_number_ranges {
  open(my $in, '<', $unicode_tables) or die "gen_moses_tables: cannot read $unicode_tables: $!\n";
  my $source = do { local $/; <$in> };
  my ($body) = $source =~ /kNumber\[\] = \{(.*?)\};/s
    or die "gen_moses_tables: no kNumber table in $unicode_tables\n";
  my @ranges;
  while ($body =~ /\{0x([0-9A-F]+), 0x([0-9A-F]+)\}/g) { push @ranges, [hex($1), hex($2)] }
  return \@ranges;
}

sub same_ranges {
  my ($a, $b) = @_;
  return 0 unless @$a == @$b;
  for my $i (0 .. $#$a) {
    return 0 unless $a->[$i][0] == $b->[$i][0] && $a->[$i][1] == $b->[$i][1];
  }
  return 1;
}

# tokenizer.perl's load_prefixes, returning [prefix, kind] pairs in file order (a later
# line for the same prefix wins, as in the Perl hash).
sub prefixes_of {
  my ($language) = @_;
  my $file = "$prefix_dir/nonbreaking_prefix.$language";
  open(my $in, '<:utf8', $file) or die "gen_moses_tables: cannot read $file: $!\n";
  my (%kind, @order);
  while (my $item = <$in>) {
    chomp($item);
    next unless $item && substr($item, 0, 1) ne '#';
    my ($prefix, $value) = $item =~ /(.*)[\s]+(\#NUMERIC_ONLY\#)/ ? ($1, 2) : ($item, 1);
    push @order, $prefix unless exists $kind{$prefix};
    $kind{$prefix} = $value;
  }
  return [map { [$_, $kind{$_}] } @order];
}

sub c_string {
  my ($text) = @_;
  my $bytes = $text;
  utf8::encode($bytes);
  my $out = '';
  for my $byte (unpack('C*', $bytes)) {
    if ($byte == 0x22 || $byte == 0x5C) { $out .= sprintf('\\%c', $byte) }
    elsif ($byte >= 0x20 && $byte < 0x7F) { $out .= chr($byte) }
    else { $out .= sprintf('\\%03o', $byte) }
  }
  return "\"$out\"";
}

sub emit_prefixes {
  my ($name, $language) = @_;
  my $prefixes = prefixes_of($language);
  print "// scripts/share/nonbreaking_prefixes/nonbreaking_prefix.$language\n";
  print "const NonbreakingPrefix ${name}[] = {\n";
  print '    {', c_string($_->[0]), ", $_->[1]},\n" for @$prefixes;
  print "};\n";
  print "const std::size_t ${name}_size = sizeof($name) / sizeof(${name}[0]);\n\n";
}

my $perl_number = ranges_of(qr/\p{IsN}/);
same_ranges($perl_number, python_number_ranges())
  or die "gen_moses_tables: Perl's \\p{IsN} differs from unicode::kNumber (Unicode versions differ?)\n";

my $unicode_version = do { require Unicode::UCD; Unicode::UCD::UnicodeVersion() };
printf "// Generated by tools/gen_moses_tables.pl from Perl %vd (Unicode %s) and the\n", $^V,
  $unicode_version;
print "// nonbreaking prefix files of mosesdecoder (LGPL-2.1, (c) the Moses authors).\n";
print "// Do not edit: rerun the generator.\n";
print "#include \"metrics/moses_tables.h\"\n\n";
print "namespace thpc::metrics::moses {\n\n";
print "const char kPerlUnicodeVersion[] = \"$unicode_version\";\n\n";
emit_ranges('kPerlSpace', 'Perl \s', ranges_of(qr/\s/));
emit_ranges('kPerlAlnum', 'Perl \p{IsAlnum}', ranges_of(qr/\p{IsAlnum}/));
emit_ranges('kPerlAlpha', 'Perl \p{IsAlpha}', ranges_of(qr/\p{IsAlpha}/));
emit_ranges('kPerlLower', 'Perl \p{IsLower}', ranges_of(qr/\p{IsLower}/));
emit_prefixes('kGermanPrefixes', 'de');
emit_prefixes('kFrenchPrefixes', 'fr');
print "}  // namespace thpc::metrics::moses\n";
