//! The shared conformance suite against sandboxes armed ahead for their configuration (see
//! `armed_support`): an armed sandbox must pass every case a cold one passes.

mod armed_support;

smithers_test_support::conformance_tests!(armed_support::make_env);
