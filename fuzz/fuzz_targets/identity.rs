//! SPIFFE workload identities as text (`spiffe://td/ns/X/sa/Y`), the form a URI SAN, a
//! topology file and an xDS resource carry. What parses prints back to itself.
#![no_main]

use ferry_core::identity::Identity;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(id) = text.parse::<Identity>() {
        assert_eq!(id.to_string(), text, "an identity prints as it was written");
        assert_eq!(id.to_string().parse::<Identity>().as_ref(), Ok(&id));
        assert_eq!(format!("spiffe://{}", id.principal()), text);
    }
});
