// The translation unit that builds the tests' precompiled header (test_pch.h); it holds
// nothing of its own.
